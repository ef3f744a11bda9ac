package rule

// MaxDepth is how many levels budgets nest: an organisation, its teams,
// their projects and the key-level tenants below them.
const MaxDepth = 4

// ShadowRefusal is a shadow limit that would have refused a request: the
// tenant (level of the tree) whose limit it is, and the limit.
type ShadowRefusal struct {
	Level string `json:"level"`
	Limit Limit  `json:"limit"`
}
