package api_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

type endUserPolicyBody struct {
	Tenant      string         `json:"tenant"`
	Source      string         `json:"source"`
	Header      *string        `json:"header"`
	Template    map[string]any `json:"template"`
	MaxEndUsers int            `json:"max_end_users"`
	IdleTTLS    int64          `json:"idle_ttl_s"`
	UpdatedBy   string         `json:"updated_by"`
}

type endUsersPage struct {
	EndUsers []struct {
		ID        string  `json:"id"`
		EndUserID string  `json:"end_user_id"`
		ExpiredAt *string `json:"expired_at"`
		Budget    struct {
			Tenant   string `json:"tenant"`
			Balances struct {
				Tokens json.Number `json:"tokens"` // decimal: refill is fractional
			} `json:"balances"`
		} `json:"budget"`
	} `json:"end_users"`
	Next *string `json:"next"`
}

func TestEndUserPolicyAdminRoutes(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	admin := b.admin(t, "ops")
	b.tenant(t, "acme", lim(10_000, "1"))
	path := "/v1/admin/tenants/acme/end-user-policy"

	if r := b.adminCall(t, admin, http.MethodGet, path, nil); r.Code != http.StatusNotFound {
		t.Fatalf("no policy yet: %d %s", r.Code, r.Body)
	}
	good := `{"source":"header","header":"x-end-user","template":{"tokens_capacity":500,"tokens_per_second":"0.5","max_concurrent":2},"max_end_users":3,"idle_ttl_s":3600}`
	r := b.adminCall(t, admin, http.MethodPut, path, good)
	if r.Code != http.StatusOK {
		t.Fatalf("%d %s", r.Code, r.Body)
	}
	var pol endUserPolicyBody
	r.json(&pol)
	if pol.Source != "header" || pol.Header == nil || *pol.Header != "X-End-User" || pol.Template["tokens_capacity"] != float64(500) ||
		pol.Template["tokens_per_second"] != "0.5" || pol.MaxEndUsers != 3 || pol.IdleTTLS != 3600 || pol.UpdatedBy != "admin:ops" {
		t.Fatalf("policy %+v", pol)
	}
	var got endUserPolicyBody
	b.adminCall(t, admin, http.MethodGet, path, nil).json(&got)
	if got.Source != pol.Source || got.MaxEndUsers != 3 || got.Template["max_concurrent"] != float64(2) {
		t.Fatalf("read back %+v", got)
	}

	// Bad bodies: a 400 naming the field, and nothing written.
	before := ledgerState(t, b)
	for field, body := range map[string]string{
		"source":                   `{"template":{"tokens_capacity":1,"tokens_per_second":1},"max_end_users":1,"idle_ttl_s":1}`,
		"template":                 `{"source":"user","max_end_users":1,"idle_ttl_s":1}`,
		"max_end_users":            `{"source":"user","template":{"tokens_capacity":1,"tokens_per_second":1},"max_end_users":0,"idle_ttl_s":1}`,
		"idle_ttl_s":               `{"source":"user","template":{"tokens_capacity":1,"tokens_per_second":1},"max_end_users":1,"idle_ttl_s":0}`,
		"header":                   `{"source":"header","header":"a b","template":{"tokens_capacity":1,"tokens_per_second":1},"max_end_users":1,"idle_ttl_s":1}`,
		"template.tokens_capacity": `{"source":"user","template":{"tokens_capacity":0,"tokens_per_second":1},"max_end_users":1,"idle_ttl_s":1}`,
		"template.period":          `{"source":"user","template":{"tokens_capacity":1,"tokens_per_second":1,"period":"week","period_budget":5},"max_end_users":1,"idle_ttl_s":1}`,
		"nope":                     `{"source":"user","nope":1,"template":{"tokens_capacity":1,"tokens_per_second":1},"max_end_users":1,"idle_ttl_s":1}`,
		"body":                     `{"source":"user"} {}`,
	} {
		r := b.adminCall(t, admin, http.MethodPut, path, body)
		if e := r.errorBody(); r.Code != http.StatusBadRequest || e.Error.Field != field {
			t.Fatalf("%s: %d %s, want a 400 naming %s", body, r.Code, r.Body, field)
		}
	}
	if r := b.adminCall(t, admin, http.MethodPut, "/v1/admin/tenants/nope/end-user-policy", good); r.Code != http.StatusNotFound {
		t.Fatalf("unknown tenant: %d %s", r.Code, r.Body)
	}
	if after := ledgerState(t, b); after != before {
		t.Fatalf("a refused policy wrote something:\n%s\n%s", before, after)
	}
	if r := b.adminCall(t, admin, http.MethodGet, "/v1/admin/tenants/acme/end-users?limit=0", nil); r.Code != http.StatusBadRequest {
		t.Fatalf("limit 0: %d", r.Code)
	}
	if r := b.adminCall(t, admin, http.MethodGet, "/v1/admin/tenants/nope/end-users", nil); r.Code != http.StatusNotFound {
		t.Fatalf("unknown tenant's end users: %d", r.Code)
	}
	if r := b.adminCall(t, admin, http.MethodDelete, path, nil); r.Code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, admin, http.MethodDelete, path, nil); r.Code != http.StatusNotFound {
		t.Fatalf("delete again: %d %s", r.Code, r.Body)
	}
	if _, err := ledger.Verify(ctx, b.pool, "acme"); err != nil {
		t.Fatal(err)
	}
}

// POST /v1/admissions: the body's user names the end user; the settle and
// release by id with the tenant's key find its admission; the list pages
// through the end users with their balances; past the cap, a new end user
// is a 429 end_user_cap.
func TestEndUserAdmissionsThroughTheAPI(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	admin := b.admin(t, "ops")
	key := b.tenant(t, "acme", lim(100_000, "0.001"))
	if r := b.adminCall(t, admin, http.MethodPut, "/v1/admin/tenants/acme/end-user-policy",
		`{"source":"user","template":{"tokens_capacity":1000,"tokens_per_second":"0.001"},"max_end_users":3,"idle_ttl_s":3600}`); r.Code != http.StatusOK {
		t.Fatalf("%d %s", r.Code, r.Body)
	}
	body := func(user string) string {
		return strings.Replace(chat(100, "hello"), `"max_tokens"`, `"user":"`+user+`","max_tokens"`, 1)
	}
	var ids []string
	var cost int64
	for _, u := range []string{"u1", "u2", "u3", "u1"} {
		r := b.call(t, key, http.MethodPost, "/v1/admissions", body(u))
		if r.Code != http.StatusCreated {
			t.Fatalf("%s: %d %s", u, r.Code, r.Body)
		}
		var a admitted
		r.json(&a)
		ids, cost = append(ids, a.ID), a.Estimate.Cost
	}
	// Settle one, release another, by id with the tenant's key.
	if r := b.call(t, key, http.MethodPost, "/v1/admissions/"+ids[0]+"/settle", `{"usage":{"prompt_tokens":10,"completion_tokens":20}}`); r.Code != http.StatusOK {
		t.Fatalf("settle: %d %s", r.Code, r.Body)
	}
	if r := b.call(t, key, http.MethodPost, "/v1/admissions/"+ids[1]+"/release", ``); r.Code != http.StatusOK {
		t.Fatalf("release: %d %s", r.Code, r.Body)
	}
	u1 := rule.EndUserTenantID("acme", "u1")
	a, err := b.store.AdmissionGet(ctx, u1, ids[0])
	if err != nil || a.State != account.StateSettled {
		t.Fatalf("u1's admission: %+v %v", a, err)
	}
	// Read by id with the tenant's key.
	if r := b.call(t, key, http.MethodGet, "/v1/admissions/"+ids[0], ""); r.Code != http.StatusOK || !strings.Contains(r.Body.String(), `"settled"`) {
		t.Fatalf("get: %d %s", r.Code, r.Body)
	}
	// Another tenant's key finds none of them.
	other := b.tenant(t, "other", lim(1000, "1"))
	if r := b.call(t, other, http.MethodGet, "/v1/admissions/"+ids[0], ""); r.Code != http.StatusNotFound {
		t.Fatalf("another tenant's get: %d %s", r.Code, r.Body)
	}
	if r := b.call(t, other, http.MethodPost, "/v1/admissions/"+ids[2]+"/release", ""); r.Code != http.StatusNotFound {
		t.Fatalf("another tenant's release: %d %s", r.Code, r.Body)
	}
	// Past the cap.
	r := b.call(t, key, http.MethodPost, "/v1/admissions", body("u4"))
	if e := r.errorBody(); r.Code != http.StatusTooManyRequests || e.Error.Type != "end_user_cap" {
		t.Fatalf("u4: %d %s", r.Code, r.Body)
	}
	// A bad id is a 400 naming the field.
	r = b.call(t, key, http.MethodPost, "/v1/admissions", strings.Replace(chat(100, "hello"), `"max_tokens"`, `"user":"a\u0001","max_tokens"`, 1))
	if e := r.errorBody(); r.Code != http.StatusBadRequest || e.Error.Field != "user" {
		t.Fatalf("bad user: %d %s", r.Code, r.Body)
	}

	var page endUsersPage
	b.adminCall(t, admin, http.MethodGet, "/v1/admin/tenants/acme/end-users?limit=2", nil).json(&page)
	if len(page.EndUsers) != 2 || page.Next == nil {
		t.Fatalf("first page %+v", page)
	}
	seen := map[string]string{}
	whole := func(n json.Number) string { w, _, _ := strings.Cut(string(n), "."); return w }
	for _, u := range page.EndUsers {
		seen[u.EndUserID] = whole(u.Budget.Balances.Tokens)
	}
	var rest endUsersPage
	b.adminCall(t, admin, http.MethodGet, "/v1/admin/tenants/acme/end-users?limit=2&after="+*page.Next, nil).json(&rest)
	if len(rest.EndUsers) != 1 || rest.Next != nil {
		t.Fatalf("second page %+v", rest)
	}
	seen[rest.EndUsers[0].EndUserID] = whole(rest.EndUsers[0].Budget.Balances.Tokens)
	// u1: one admission settled at 30, one open at its cost; u2 released:
	// full; u3 open.
	// (Refill is 0.001 a second: under a token in this test.)
	if len(seen) != 3 || seen["u1"] != strconv.FormatInt(1000-30-cost, 10) || seen["u2"] != "1000" || seen["u3"] != strconv.FormatInt(1000-cost, 10) {
		t.Fatalf("end users' balances %v", seen)
	}
	for _, id := range []string{"acme", u1, rule.EndUserTenantID("acme", "u2")} {
		if _, err := ledger.Verify(ctx, b.pool, id); err != nil {
			t.Fatal(id, err)
		}
	}
	// The tenant's own view lists no end user among its tenants.
	var list struct {
		Tenants []struct {
			Tenant string `json:"tenant"`
		} `json:"tenants"`
	}
	b.adminCall(t, admin, http.MethodGet, "/v1/admin/tenants", nil).json(&list)
	if len(list.Tenants) != 2 {
		t.Fatalf("tenants %+v", list)
	}
}
