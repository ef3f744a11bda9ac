package estimator

// EndUserFields are the fields of a request body that may name the
// caller's end user (a tenant's end-user policy says which one counts),
// each as the JSON value it held (nil: absent): OpenAI's `user` and
// `safety_identifier`, Anthropic's `metadata.user_id`. They are read from
// the object the parse decoded anyway, so a request pays nothing more for
// them; their form is checked by whoever uses one (budget.ValidateEndUserID),
// only when a policy names it.
type EndUserFields struct {
	User             any
	SafetyIdentifier any
	MetadataUserID   any
}

// EndUserFields returns the request's end-user fields.
func (r *Request) EndUserFields() EndUserFields {
	if r == nil {
		return EndUserFields{}
	}
	return r.endUser
}

// endUserFieldsOf reads the end-user fields of a decoded body.
func endUserFieldsOf(obj map[string]any) EndUserFields {
	f := EndUserFields{User: obj["user"], SafetyIdentifier: obj["safety_identifier"]}
	if m, ok := obj["metadata"].(map[string]any); ok {
		f.MetadataUserID = m["user_id"]
	}
	return f
}
