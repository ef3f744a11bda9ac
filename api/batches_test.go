package api_test

import (
	"net/http"
	"testing"
)

// The batch allowance over HTTP: none at first (404), set, read back, and
// bad bodies are 400s naming the field; a tenant that does not exist is a
// 404; the change is a limits entry in the tenant's ledger.
func TestBatchAllowanceOverHTTP(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	admin := b.admin(t, "ops")
	b.tenant(t, "acme", lim(1000, "1"))
	path := "/v1/admin/tenants/acme/batch-allowance"
	if r := b.adminCall(t, admin, http.MethodGet, path, nil); r.Code != http.StatusNotFound {
		t.Fatalf("before any: %d %s", r.Code, r.Body)
	}
	for body, field := range map[string]string{
		`{}`:                                  "capacity",
		`{"capacity":-1}`:                     "batch_tokens_capacity",
		`{"capacity":10,"models":["gpt-4o"]}`: "models", // the tenant's and keys' model scopes
		`{"capacity":10,"speed":1}`:           "speed",
		`{"capacity":"ten"}`:                  "capacity",
	} {
		if r := b.adminCall(t, admin, http.MethodPut, path, body); r.Code != http.StatusBadRequest || r.errorBody().Error.Field != field {
			t.Fatalf("%s: %d %s, want 400 on %s", body, r.Code, r.Body, field)
		}
	}
	if r := b.adminCall(t, admin, http.MethodPut, "/v1/admin/tenants/nobody/batch-allowance", `{"capacity":10}`); r.Code != http.StatusNotFound {
		t.Fatalf("nobody: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, admin, http.MethodPut, path, `{"capacity":5000}`); r.Code != http.StatusOK {
		t.Fatalf("put: %d %s", r.Code, r.Body)
	}
	var got struct {
		Tenant   string   `json:"tenant"`
		Capacity int64    `json:"capacity"`
		Enqueued float64  `json:"enqueued"`
		Models   []string `json:"models"` // none any more
	}
	b.adminCall(t, admin, http.MethodGet, path, nil).json(&got)
	if got.Tenant != "acme" || got.Capacity != 5000 || got.Enqueued != 0 || got.Models != nil {
		t.Fatalf("read back %+v", got)
	}
	var ledger struct {
		Entries []struct {
			Kind   string `json:"kind"`
			Detail any    `json:"detail"`
			Actor  string `json:"actor"`
		} `json:"entries"`
	}
	b.adminCall(t, admin, http.MethodGet, "/v1/admin/ledger?tenant=acme&kind=limits", nil).json(&ledger)
	if len(ledger.Entries) != 1 || ledger.Entries[0].Actor != "admin:ops" {
		t.Fatalf("ledger %+v", ledger)
	}
}
