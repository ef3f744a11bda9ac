package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/credential"
)

// Pools over HTTP: created with their models, weights set, a rejection by
// the pool names it, the list shows what each tenant was served; a key's
// priority class is changed with a ledger entry.
func TestPoolsAndKeyPriorityOverHTTP(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	admin := b.admin(t, "ops")
	key := b.tenant(t, "acme", lim(1_000_000, "1000"))
	b.tenant(t, "beta", lim(1_000_000, "1000"))
	for body, field := range map[string]string{
		`{"id":"gpu","tokens_capacity":0,"tokens_per_second":1}`:             "tokens_capacity",
		`{"id":"gpu","tokens_capacity":100}`:                                 "tokens_per_second",
		`{"id":"Bad Id","tokens_capacity":100,"tokens_per_second":1}`:        "id",
		`{"id":"gpu","tokens_capacity":100,"tokens_per_second":"x"}`:         "tokens_per_second",
		`{"id":"gpu","tokens_capacity":100,"tokens_per_second":1,"speed":1}`: "speed",
	} {
		if r := b.adminCall(t, admin, http.MethodPost, "/v1/admin/pools", body); r.Code != http.StatusBadRequest || r.errorBody().Error.Field != field {
			t.Fatalf("%s: %d %s, want 400 on %s", body, r.Code, r.Body, field)
		}
	}
	if r := b.adminCall(t, admin, http.MethodPost, "/v1/admin/pools", `{"id":"gpu","tokens_capacity":150,"tokens_per_second":"0.001","models":["gpt-4o"]}`); r.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, admin, http.MethodPost, "/v1/admin/pools", `{"id":"gpu","tokens_capacity":150,"tokens_per_second":1}`); r.Code != http.StatusConflict {
		t.Fatalf("create twice: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, admin, http.MethodPut, "/v1/admin/pools/gpu/weights/beta", `{"weight":2}`); r.Code != http.StatusNoContent {
		t.Fatalf("weight: %d %s", r.Code, r.Body)
	}
	for path, code := range map[string]int{"/v1/admin/pools/nope/weights/beta": 404, "/v1/admin/pools/gpu/weights/nobody": 404} {
		if r := b.adminCall(t, admin, http.MethodPut, path, `{"weight":2}`); r.Code != code {
			t.Fatalf("%s: %d %s", path, r.Code, r.Body)
		}
	}
	if r := b.adminCall(t, admin, http.MethodPut, "/v1/admin/pools/gpu/weights/beta", `{"weight":0}`); r.Code != http.StatusBadRequest {
		t.Fatalf("weight 0: %d", r.Code)
	}
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "x")); r.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", r.Code, r.Body)
	}
	r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "x"))
	var rej struct {
		Error struct{ Limit, Pool string } `json:"error"`
	}
	r.json(&rej)
	if r.Code != http.StatusTooManyRequests || rej.Error.Limit != "pool" || rej.Error.Pool != "gpu" {
		t.Fatalf("over the pool: %d %s", r.Code, r.Body)
	}
	var list struct {
		Pools []struct {
			ID     string   `json:"id"`
			Models []string `json:"models"`
			Shares []struct {
				Tenant string `json:"tenant"`
				Weight int64  `json:"weight"`
				Served int64  `json:"served"`
			} `json:"shares"`
		} `json:"pools"`
	}
	b.adminCall(t, admin, http.MethodGet, "/v1/admin/pools", nil).json(&list)
	if len(list.Pools) != 1 || strings.Join(list.Pools[0].Models, ",") != "gpt-4o" || len(list.Pools[0].Shares) != 2 ||
		list.Pools[0].Shares[0].Tenant != "acme" || list.Pools[0].Shares[0].Served <= 100 || list.Pools[0].Shares[1].Weight != 2 {
		t.Fatalf("list: %+v", list)
	}
	if r := b.adminCall(t, admin, http.MethodDelete, "/v1/admin/pools/gpu/models?model=gpt-4o", nil); r.Code != http.StatusNoContent {
		t.Fatalf("unroute: %d %s", r.Code, r.Body)
	}
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "x")); r.Code != http.StatusCreated {
		t.Fatalf("off the pool: %d %s", r.Code, r.Body)
	}

	keys, err := credential.KeyList(ctx, b.pool, "acme")
	if err != nil || len(keys) != 1 || keys[0].Priority != "standard" {
		t.Fatalf("keys %+v %v", keys, err)
	}
	path := "/v1/admin/tenants/acme/keys/" + keys[0].ID
	if r := b.adminCall(t, admin, http.MethodPatch, path, `{"priority":"urgent"}`); r.Code != http.StatusBadRequest {
		t.Fatalf("bad class: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, admin, http.MethodPatch, path, `{"priority":"critical"}`); r.Code != http.StatusNoContent {
		t.Fatalf("critical: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, admin, http.MethodPatch, "/v1/admin/tenants/beta/keys/"+keys[0].ID, `{"priority":"critical"}`); r.Code != http.StatusNotFound {
		t.Fatalf("another tenant's key: %d %s", r.Code, r.Body)
	}
	keys, _ = credential.KeyList(ctx, b.pool, "acme")
	var reason string
	if err := b.pool.QueryRow(ctx, `SELECT reason FROM ledger_entries WHERE tenant_id = 'acme' ORDER BY seq DESC LIMIT 1`).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if keys[0].Priority != "critical" || !strings.Contains(reason, "priority critical") {
		t.Fatalf("priority %s, last entry %q", keys[0].Priority, reason)
	}
}
