package api_test

import (
	"net/http"
	"strings"
	"testing"
)

// POST /v1/admissions under a policy of safety_identifier: a body that
// names its end user only by user (or metadata.user_id) is a 400 naming
// safety_identifier, with nothing admitted and no end user made, never
// the tenant's own admission (issue 36 item 6); a body that names none is
// the tenant's own.
func TestEndUserInAnotherFieldIsRefusedByTheAPI(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	admin := b.admin(t, "ops")
	key := b.tenant(t, "acme", lim(100_000, "0.001"))
	if r := b.adminCall(t, admin, http.MethodPut, "/v1/admin/tenants/acme/end-user-policy",
		`{"source":"safety_identifier","template":{"tokens_capacity":1000,"tokens_per_second":"0.001"},"max_end_users":3,"idle_ttl_s":3600}`); r.Code != http.StatusOK {
		t.Fatalf("%d %s", r.Code, r.Body)
	}
	for _, field := range []string{`"user":"u1"`, `"metadata":{"user_id":"u1"}`} {
		r := b.call(t, key, http.MethodPost, "/v1/admissions", strings.Replace(chat(100, "hello"), `"max_tokens"`, field+`,"max_tokens"`, 1))
		if e := r.errorBody(); r.Code != http.StatusBadRequest || e.Error.Field != "safety_identifier" {
			t.Fatalf("%s: %d %s", field, r.Code, r.Body)
		}
	}
	if n, err := b.store.EndUserList(ctx, "acme", "", 10); err != nil || len(n) != 0 {
		t.Fatalf("refused calls made %d end users (%v)", len(n), err)
	}
	if as, err := b.store.AdmissionRecent(ctx, "acme", 10); err != nil || len(as) != 0 {
		t.Fatalf("refused calls made %d admissions of the tenant (%v)", len(as), err)
	}
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hello")); r.Code != http.StatusCreated {
		t.Fatalf("a call naming no end user: %d %s", r.Code, r.Body)
	}
}
