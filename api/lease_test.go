package api_test

import (
	"net/http"
	"testing"
)

// The admin API's lease mode: off until set, a bad body a 400 naming the
// field (changing nothing), an unknown tenant a 404, and the answer names
// the rule that keeps a tenant exact.
func TestAdminTenantLease(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "ops")
	if r := b.adminCall(t, token, http.MethodPost, "/v1/admin/tenants", map[string]any{"id": "acme", "tokens_capacity": 1000, "tokens_per_second": 1, "max_concurrent": 2}); r.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Code, r.Body)
	}
	type modeJSON struct {
		TenantID  string `json:"tenant_id"`
		Mode      string `json:"mode"`
		ExactOnly *struct {
			TenantID string `json:"tenant_id"`
			Rule     string `json:"rule"`
		} `json:"exact_only"`
	}
	var got modeJSON
	r := b.adminCall(t, token, http.MethodGet, "/v1/admin/tenants/acme/lease", nil)
	if r.Code != http.StatusOK {
		t.Fatalf("get: %d %s", r.Code, r.Body)
	}
	if r.json(&got); got.Mode != "off" {
		t.Fatalf("mode of a new tenant: %+v", got)
	}
	for _, body := range []string{`{"mode":"on"}`, `{}`, `{"mode":1}`, `{"mode":"auto","extra":1}`} {
		if r := b.adminCall(t, token, http.MethodPut, "/v1/admin/tenants/acme/lease", body); r.Code != http.StatusBadRequest || r.errorBody().Error.Field == "" {
			t.Errorf("put %s: %d %s, want a 400 naming a field", body, r.Code, r.Body)
		}
	}
	r = b.adminCall(t, token, http.MethodPut, "/v1/admin/tenants/acme/lease", `{"mode":"auto"}`)
	if r.Code != http.StatusOK {
		t.Fatalf("put auto: %d %s", r.Code, r.Body)
	}
	got = modeJSON{}
	r.json(&got)
	if got.Mode != "auto" || got.ExactOnly == nil || got.ExactOnly.TenantID != "acme" || got.ExactOnly.Rule != "concurrency limit" {
		t.Fatalf("put auto: %s", r.Body)
	}
	r = b.adminCall(t, token, http.MethodGet, "/v1/admin/tenants/acme/lease", nil)
	if r.json(&got); got.Mode != "auto" {
		t.Fatalf("mode after put: %s", r.Body)
	}
	if r := b.adminCall(t, token, http.MethodPut, "/v1/admin/tenants/nobody/lease", `{"mode":"auto"}`); r.Code != http.StatusNotFound {
		t.Errorf("put of an unknown tenant: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, token, http.MethodGet, "/v1/admin/tenants/nobody/lease", nil); r.Code != http.StatusNotFound {
		t.Errorf("get of an unknown tenant: %d %s", r.Code, r.Body)
	}
}
