package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// TestModelScopesThroughTheAPI: an administrator sets a parent's and a
// child's model scopes and creates a key with its own; the HTTP API's
// admissions follow all three (403 model_not_allowed naming the model and
// the field, nothing debited, no ledger entry), each change is in the
// ledger, and bad lists are 400s naming the field.
func TestModelScopesThroughTheAPI(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	admin := b.admin(t, "ops")
	lim := rule.Limits{TokensCapacity: 100_000, TokensRateMicro: rule.Micro}
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: "org", Limits: lim}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: "team", Parent: "org", Limits: lim}); err != nil {
		t.Fatal(err)
	}
	if r := b.adminCall(t, admin, http.MethodPut, "/v1/admin/tenants/org/models", `{"models":["gpt-*"," claude-*","gpt-*"]}`); r.Code != http.StatusOK ||
		!strings.Contains(r.Body.String(), `{"models":["gpt-*","claude-*"]}`) {
		t.Fatalf("PUT org models: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, admin, http.MethodPut, "/v1/admin/tenants/team/models", `{"models":["gpt-4o*","o3"]}`); r.Code != http.StatusOK {
		t.Fatalf("PUT team models: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, admin, http.MethodGet, "/v1/admin/tenants/team/models", nil); r.Code != http.StatusOK || !strings.Contains(r.Body.String(), `["gpt-4o*","o3"]`) {
		t.Fatalf("GET team models: %d %s", r.Code, r.Body)
	}
	for _, bad := range []string{`{"models":["gpt 4o"]}`, `{"models":[""]}`, `{}`, `{"models":"gpt-4o"}`} {
		r := b.adminCall(t, admin, http.MethodPut, "/v1/admin/tenants/team/models", bad)
		if e := r.errorBody(); r.Code != http.StatusBadRequest || e.Error.Field != "models" {
			t.Fatalf("PUT %s: %d %s, want a 400 naming models", bad, r.Code, r.Body)
		}
	}
	if r := b.adminCall(t, admin, http.MethodPut, "/v1/admin/tenants/nobody/models", `{"models":[]}`); r.Code != http.StatusNotFound {
		t.Fatalf("PUT on no tenant: %d %s", r.Code, r.Body)
	}
	r := b.adminCall(t, admin, http.MethodPost, "/v1/admin/tenants/team/keys", `{"models":["gpt-4o-mini","claude-*"]}`)
	var key struct {
		ID     string   `json:"id"`
		Secret string   `json:"secret"`
		Models []string `json:"models"`
	}
	r.json(&key)
	if r.Code != http.StatusCreated || len(key.Models) != 2 {
		t.Fatalf("create a scoped key: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, admin, http.MethodPost, "/v1/admin/tenants/team/keys", `{"models":["a b"]}`); r.Code != http.StatusBadRequest || r.errorBody().Error.Field != "models" {
		t.Fatalf("create a key with a bad list: %d %s", r.Code, r.Body)
	}

	admit := func(model string) response {
		return b.call(t, key.Secret, http.MethodPost, "/v1/admissions",
			`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`)
	}
	for _, c := range []struct{ model, who string }{
		{"gpt-4o", "this API key"},           // the team's, not the key's
		{"claude-sonnet-4-5", "tenant team"}, // the key's, not the team's
		{"o3", "tenant org"},                 // the team's, not its parent's
	} {
		micro, seq := b.balance(t, "team")
		pmicro, pseq := b.balance(t, "org")
		r := admit(c.model)
		e := r.errorBody()
		if r.Code != http.StatusForbidden || e.Error.Type != "model_not_allowed" || e.Error.Field != "model" || e.Error.Limit != "model_scope" ||
			!strings.Contains(e.Error.Message, c.model) || !strings.Contains(e.Error.Message, c.who) {
			t.Fatalf("%s: %d %s, want a 403 model_not_allowed by %s", c.model, r.Code, r.Body, c.who)
		}
		if m, s := b.balance(t, "team"); m != micro || s != seq {
			t.Fatalf("%s: the team's balance or ledger moved on a refusal", c.model)
		}
		if m, s := b.balance(t, "org"); m != pmicro || s != pseq {
			t.Fatalf("%s: the org's balance or ledger moved on a refusal", c.model)
		}
	}
	if r := admit("gpt-4o-mini"); r.Code != http.StatusCreated {
		t.Fatalf("an allowed model: %d %s", r.Code, r.Body)
	}
	// The key's scope changed: gpt-4o now passes.
	if r := b.adminCall(t, admin, http.MethodPatch, "/v1/admin/tenants/team/keys/"+key.ID, `{"models":["gpt-4o"]}`); r.Code != http.StatusNoContent {
		t.Fatalf("PATCH key models: %d %s", r.Code, r.Body)
	}
	if r := admit("gpt-4o"); r.Code != http.StatusCreated {
		t.Fatalf("gpt-4o after the key's change: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, admin, http.MethodPatch, "/v1/admin/tenants/team/keys/"+key.ID, `{"models":["x y"],"priority":"critical"}`); r.Code != http.StatusBadRequest {
		t.Fatalf("PATCH with a bad list: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, admin, http.MethodPatch, "/v1/admin/tenants/team/keys/nokey", `{"models":[]}`); r.Code != http.StatusNotFound {
		t.Fatalf("PATCH no key: %d %s", r.Code, r.Body)
	}
	// Each change is in the ledger, by its actor.
	es, err := ledger.EntryList(ctx, b.pool, "team", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var models, keyModels int
	for _, e := range es {
		switch {
		case e.Kind == ledger.KindLimits && e.Reason == "models" && strings.Contains(e.Detail, `"after":["gpt-4o*","o3"]`):
			models++
		case e.Kind == ledger.KindTenant && strings.Contains(e.Detail, `"event":"key_models"`) && strings.Contains(e.Detail, `"before":["gpt-4o-mini","claude-*"]`):
			keyModels++
		}
	}
	if models != 1 || keyModels != 1 {
		t.Fatalf("ledger: %d tenant scope entries, %d key scope entries; want 1 and 1", models, keyModels)
	}
}
