package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
)

// budgetJSONTree is a tenant of GET /v1/admin/tenants/{id}/tree.
type budgetJSONTree struct {
	Tenant string   `json:"tenant"`
	Parent *string  `json:"parent"`
	Path   []string `json:"path"`
	Limits struct {
		Shadow []string `json:"shadow"`
	} `json:"limits"`
	Balances struct {
		Tokens           json.Number `json:"tokens"`
		OpenReservations int64       `json:"open_reservations"`
	} `json:"balances"`
	Children []budgetJSONTree `json:"children"`
}

// The admin API builds a tree, shows it with each level's balances, and a
// rejection by an ancestor names that level; shadow limits are set and
// cleared through the limits patch, and what they would have refused is a
// metric by limit.
func TestBudgetTreeAndShadowOverHTTP(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	admin := b.admin(t, "ops")
	for _, body := range []string{
		`{"id":"org","tokens_capacity":150,"tokens_per_second":"0.001"}`,
		`{"id":"team","parent":"org","tokens_capacity":1000,"tokens_per_second":"1","max_concurrent":10,"shadow":["concurrency"]}`,
	} {
		if r := b.adminCall(t, admin, http.MethodPost, "/v1/admin/tenants", body); r.Code != http.StatusCreated {
			t.Fatalf("create %s: %d %s", body, r.Code, r.Body)
		}
	}
	var created budgetJSONTree
	r := b.adminCall(t, admin, http.MethodPost, "/v1/admin/tenants", `{"id":"svc","parent":"team","tokens_capacity":1000,"tokens_per_second":"1"}`)
	r.json(&created)
	if r.Code != http.StatusCreated || created.Parent == nil || *created.Parent != "team" || strings.Join(created.Path, ",") != "org,team" {
		t.Fatalf("create svc: %d %s", r.Code, r.Body)
	}
	for body, field := range map[string]string{
		`{"id":"x","parent":"nobody","tokens_capacity":10,"tokens_per_second":"1"}`:     "parent",
		`{"id":"y","tokens_capacity":10,"tokens_per_second":"1","shadow":["requests"]}`: "shadow",
		`{"id":"z","tokens_capacity":10,"tokens_per_second":"1","shadow":["speed"]}`:    "shadow",
		`{"id":"w","tokens_capacity":10,"tokens_per_second":"1","parent":5}`:            "",
	} {
		r := b.adminCall(t, admin, http.MethodPost, "/v1/admin/tenants", body)
		if r.Code != http.StatusBadRequest || field != "" && r.errorBody().Error.Field != field {
			t.Fatalf("%s: %d %s, want 400 on %q", body, r.Code, r.Body, field)
		}
	}
	_, secret, err := credential.KeyCreate(ctx, b.pool, "svc")
	if err != nil {
		t.Fatal(err)
	}
	var first struct {
		Estimate struct {
			Cost int64 `json:"cost"`
		} `json:"estimate"`
	}
	r = b.call(t, secret, http.MethodPost, "/v1/admissions", chat(100, "x"))
	r.json(&first)
	if r.Code != http.StatusCreated || first.Estimate.Cost <= 75 {
		t.Fatalf("first: %d %s", r.Code, r.Body)
	}
	r = b.call(t, secret, http.MethodPost, "/v1/admissions", chat(100, "x"))
	var rej struct {
		Error struct {
			Limit string `json:"limit"`
			Level string `json:"level"`
		} `json:"error"`
	}
	r.json(&rej)
	if r.Code != http.StatusTooManyRequests || rej.Error.Limit != "tokens" || rej.Error.Level != "org" ||
		r.Header().Get("X-Ratelimit-Limit-Tokens") != "150" {
		t.Fatalf("over the organisation's budget: %d %s %v", r.Code, r.Body, r.Header())
	}

	var tree budgetJSONTree
	r = b.adminCall(t, admin, http.MethodGet, "/v1/admin/tenants/svc/tree", nil)
	r.json(&tree)
	if r.Code != http.StatusOK || tree.Tenant != "org" || len(tree.Children) != 1 || tree.Children[0].Tenant != "team" ||
		len(tree.Children[0].Children) != 1 || tree.Children[0].Children[0].Tenant != "svc" {
		t.Fatalf("tree: %d %s", r.Code, r.Body)
	}
	team := tree.Children[0]
	orgTokens, _ := tree.Balances.Tokens.Float64() // refilling at 0.001/s meanwhile
	if int64(orgTokens) != 150-first.Estimate.Cost || team.Balances.OpenReservations != 1 || strings.Join(team.Limits.Shadow, ",") != "concurrency" {
		t.Fatalf("gauges: org %s tokens, team %d open, shadow %v", tree.Balances.Tokens, team.Balances.OpenReservations, team.Limits.Shadow)
	}
	if r := b.adminCall(t, admin, http.MethodGet, "/v1/admin/tenants/nobody/tree", nil); r.Code != http.StatusNotFound {
		t.Fatalf("tree of nobody: %d", r.Code)
	}

	// Shadow off through the patch: a limits entry records it.
	if r := b.adminCall(t, admin, http.MethodPatch, "/v1/admin/tenants/team/limits", `{"shadow":[]}`); r.Code != http.StatusOK {
		t.Fatalf("shadow off: %d %s", r.Code, r.Body)
	}
	var kind, detail string
	if err := b.pool.QueryRow(ctx, `SELECT kind, detail FROM ledger_entries WHERE tenant_id = 'team' ORDER BY seq DESC LIMIT 1`).Scan(&kind, &detail); err != nil {
		t.Fatal(err)
	}
	if kind != "limits" || !strings.Contains(detail, `"shadow":["concurrency"]`) {
		t.Fatalf("last entry of team: %s %s", kind, detail)
	}
}

// A shadow limit's refusals are a metric by limit and never a 429.
func TestShadowRefusalsAreAMetric(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	l := lim(100, "0.001")
	l.Shadow = l.Shadow.With(rule.LimitTokens)
	key := b.tenant(t, "acme", l)
	for i := range 3 {
		if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(90, "x")); r.Code != http.StatusCreated {
			t.Fatalf("request %d: %d %s", i, r.Code, r.Body)
		}
	}
	res := b.call(t, "", http.MethodGet, "/metrics", "")
	if want := `tokengate_shadow_refusals_total{limit="tokens"} 2`; !strings.Contains(res.Body.String(), want) {
		t.Fatalf("metrics lack %q", want)
	}
}

// Model limits over HTTP: set, listed with balances, a rejection names the
// model and its limit, removed; bad bodies are 400s naming the field.
func TestModelLimitsOverHTTP(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	admin := b.admin(t, "ops")
	key := b.tenant(t, "acme", lim(1_000_000, "1000"))
	put := func(body string) response {
		return b.adminCall(t, admin, http.MethodPut, "/v1/admin/tenants/acme/model-limits", body)
	}
	for body, field := range map[string]string{
		`{"model":"gpt-4o"}`:                                                                            "input_tokens_capacity",
		`{"model":"gpt-4o","input_tokens_capacity":10}`:                                                 "input_tokens_per_second",
		`{"model":"","input_tokens_capacity":10,"input_tokens_per_second":1}`:                           "model",
		`{"model":"gpt-4o","input_tokens_capacity":10,"input_tokens_per_second":1,"shadow":["tokens"]}`: "shadow",
		`{"model":"gpt-4o","input_tokens_capacity":10,"input_tokens_per_second":1,"speed":1}`:           "speed",
	} {
		if r := put(body); r.Code != http.StatusBadRequest || r.errorBody().Error.Field != field {
			t.Fatalf("%s: %d %s, want 400 on %s", body, r.Code, r.Body, field)
		}
	}
	if r := put(`{"model":"gpt-4o","input_tokens_capacity":5000,"input_tokens_per_second":"0.001","output_tokens_capacity":50,"output_tokens_per_second":"0.001"}`); r.Code != http.StatusOK {
		t.Fatalf("put: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, admin, http.MethodPut, "/v1/admin/tenants/nobody/model-limits", `{"model":"gpt-4o","output_tokens_capacity":50,"output_tokens_per_second":1}`); r.Code != http.StatusNotFound {
		t.Fatalf("put for nobody: %d", r.Code)
	}
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(40, "hello")); r.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", r.Code, r.Body)
	}
	r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(40, "hello"))
	var rej struct {
		Error struct {
			Limit, Level, Model string
		} `json:"error"`
	}
	r.json(&rej)
	if r.Code != http.StatusTooManyRequests || rej.Error.Limit != "output_tokens" || rej.Error.Model != "gpt-4o" || rej.Error.Level != "acme" {
		t.Fatalf("over the output bucket: %d %s", r.Code, r.Body)
	}
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(60, "hello")); r.Code != http.StatusUnprocessableEntity {
		t.Fatalf("more output than the bucket holds: %d %s", r.Code, r.Body)
	}
	var list struct {
		ModelLimits []struct {
			Model    string `json:"model"`
			Balances struct {
				InputTokens  json.Number `json:"input_tokens"`
				OutputTokens json.Number `json:"output_tokens"`
			} `json:"balances"`
		} `json:"model_limits"`
	}
	b.adminCall(t, admin, http.MethodGet, "/v1/admin/tenants/acme/model-limits", nil).json(&list)
	if len(list.ModelLimits) != 1 || list.ModelLimits[0].Model != "gpt-4o" || !strings.HasPrefix(string(list.ModelLimits[0].Balances.OutputTokens), "10") {
		t.Fatalf("list: %+v", list)
	}
	if r := b.adminCall(t, admin, http.MethodDelete, "/v1/admin/tenants/acme/model-limits?model=gpt-4o", nil); r.Code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, admin, http.MethodDelete, "/v1/admin/tenants/acme/model-limits?model=gpt-4o", nil); r.Code != http.StatusNotFound {
		t.Fatalf("delete again: %d %s", r.Code, r.Body)
	}
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(40, "hello")); r.Code != http.StatusCreated {
		t.Fatalf("after the delete: %d %s", r.Code, r.Body)
	}
}
