package web_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
)

// TestPoolAndModelLimitFormsRefuse: the new forms need the CSRF token,
// answer a refused form with the page and the field's reason (422) and
// change nothing, answer a missing pool, model or key with a 404 page, and
// send a GET of a form's address back to its page.
func TestPoolAndModelLimitFormsRefuse(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.tenant(t, "acme", limits(1000, "1"))
	if err := b.store.CreatePool(ctx, "gpu", rule.PoolLimits{TokensCapacity: 100, TokensRateMicro: 1_000_000}); err != nil {
		t.Fatal(err)
	}
	keys, err := credential.KeyList(ctx, b.pool, "acme")
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %v %v", keys, err)
	}
	c := b.client(t, "192.0.2.31")
	c.mustLogin()

	for _, path := range []string{"/pools", "/pools/gpu/limits", "/pools/gpu/routes", "/pools/gpu/unroute", "/pools/gpu/weights",
		"/tenants/acme/model-limits", "/tenants/acme/model-limits/remove", "/tenants/acme/keys/" + keys[0].ID + "/priority"} {
		if rec := c.post(path, url.Values{"id": {"x"}, "model": {"m"}, "priority": {"critical"}}); rec.Code != http.StatusForbidden {
			t.Errorf("POST %s without a CSRF token: %d, want 403", path, rec.Code)
		}
	}

	csrf := c.csrf("/pools")
	for _, tc := range []struct {
		path string
		form url.Values
		want string
	}{
		{"/pools", url.Values{"id": {"gpu"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1"}}, "id: a pool with this id already exists"},
		{"/pools", url.Values{"id": {"Bad Id"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1"}}, "id: must be 1-63"},
		{"/pools", url.Values{"id": {"p2"}, "tokens_capacity": {"10"}, "tokens_per_second": {"0"}}, "tokens_per_second: must be greater than 0"},
		{"/pools/gpu/limits", url.Values{"tokens_capacity": {"0"}, "tokens_per_second": {"1"}}, "tokens_capacity: must be between 1"},
		{"/pools/gpu/routes", url.Values{"model": {""}}, "model: is required"},
		{"/pools/gpu/routes", url.Values{"model": {strings.Repeat("m", 201)}}, "model: must be 1 to 200 characters"},
		{"/pools/gpu/weights", url.Values{"tenant": {"ghost"}, "weight": {"2"}}, "tenant: no tenant has the id &#34;ghost&#34;"},
		{"/pools/gpu/weights", url.Values{"tenant": {"acme"}, "weight": {"1000001"}}, "weight: must be between 1 and 1000000"},
		{"/tenants/acme/model-limits", url.Values{"model": {"gpt-4o"}}, "input_tokens_capacity: set an input or an output bucket"},
		{"/tenants/acme/model-limits", url.Values{"model": {"gpt-4o"}, "output_tokens_capacity": {"5"}, "output_tokens_per_second": {"1"},
			"shadow": {"input_tokens"}}, "shadow: a shadow limit must be configured"},
	} {
		tc.form.Set("csrf", csrf)
		rec := c.post(tc.path, tc.form)
		if rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("POST %s %v: %d, want 422 naming %q", tc.path, tc.form, rec.Code, tc.want)
		}
	}
	pools, err := b.store.Pools(ctx)
	if err != nil || len(pools) != 1 || pools[0].Limits.TokensCapacity != 100 || len(pools[0].Models) != 0 || len(pools[0].Shares) != 0 {
		t.Errorf("the pools after refused forms: %+v %v", pools, err)
	}
	if n := b.count(t, `SELECT count(*) FROM ledger_entries WHERE kind = 'limits'`); n != 0 {
		t.Errorf("%d limits entries after refused forms", n)
	}

	for _, tc := range []struct {
		path   string
		form   url.Values
		status int
		want   string
	}{
		{"/pools/nope/limits", url.Values{"tokens_capacity": {"10"}, "tokens_per_second": {"1"}}, http.StatusNotFound, "There is no pool with that id."},
		{"/pools/nope/weights", url.Values{"tenant": {"acme"}, "weight": {"2"}}, http.StatusNotFound, "There is no pool with that id."},
		{"/pools/nope/routes", url.Values{"model": {"gpt-4o"}}, http.StatusNotFound, "There is no pool with that id."},
		{"/pools/gpu/unroute", url.Values{"model": {"gpt-4o"}}, http.StatusNotFound, "That model is not routed to this pool"},
		{"/tenants/acme/model-limits/remove", url.Values{"model": {"gpt-4o"}}, http.StatusNotFound, "This tenant has no limits for that model"},
		{"/tenants/nope/model-limits", url.Values{"model": {"gpt-4o"}, "input_tokens_capacity": {"5"}, "input_tokens_per_second": {"1"}},
			http.StatusNotFound, "There is no tenant with that id."},
		{"/tenants/acme/keys/" + keys[0].ID + "/priority", url.Values{"priority": {"urgent"}}, http.StatusUnprocessableEntity, "critical, standard or sheddable"},
		{"/tenants/acme/keys/nokey/priority", url.Values{"priority": {"critical"}}, http.StatusNotFound, "no such active key"},
	} {
		tc.form.Set("csrf", csrf)
		rec := c.post(tc.path, tc.form)
		if rec.Code != tc.status || !strings.Contains(rec.Body.String(), tc.want) || !strings.Contains(rec.Header().Get("Content-Type"), "text/html") {
			t.Errorf("POST %s: %d, want a %d page saying %q", tc.path, rec.Code, tc.status, tc.want)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM ledger_entries WHERE reason LIKE 'key priority%'`); n != 0 {
		t.Errorf("%d priority entries after refused changes", n)
	}

	for path, to := range map[string]string{
		"/pools/gpu/limits": "/pools", "/pools/gpu/weights": "/pools",
		"/tenants/acme/model-limits": "/tenants/acme", "/tenants/acme/model-limits/remove": "/tenants/acme",
		"/tenants/acme/keys/" + keys[0].ID + "/priority": "/tenants/acme",
	} {
		if rec := c.get(path); rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != to {
			t.Errorf("GET %s (a form's address): %d %q, want a redirect to %s", path, rec.Code, rec.Header().Get("Location"), to)
		}
	}
	// The pools page needs a session, like every page.
	anon := b.client(t, "192.0.2.32")
	if rec := anon.get("/pools"); rec.Code != http.StatusSeeOther || !strings.HasPrefix(rec.Header().Get("Location"), "/login") {
		t.Errorf("GET /pools logged out: %d %q", rec.Code, rec.Header().Get("Location"))
	}
}
