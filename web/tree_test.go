package web_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
)

func (b *testBundle) child(t *testing.T, id, parent string, l rule.Limits) {
	t.Helper()
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Parent: parent, Limits: l, Actor: "test"}); err != nil {
		t.Fatal(err)
	}
}

// keyFor creates a key for a tenant and returns its secret.
func (b *testBundle) keyFor(t *testing.T, id string) string {
	t.Helper()
	_, secret, err := credential.KeyCreate(ctx, b.pool, id)
	if err != nil {
		t.Fatal(err)
	}
	return secret
}

// liveIDs polls the live JSON and returns its tenants' ids in order.
func (c *client) liveIDs(path string) []string {
	c.t.Helper()
	rec := c.get(path)
	var live struct {
		Tenants []struct {
			ID     string            `json:"id"`
			Fields map[string]string `json:"fields"`
		} `json:"tenants"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &live); err != nil || rec.Code != http.StatusOK {
		c.t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body.String())
	}
	var ids []string
	for _, t := range live.Tenants {
		ids = append(ids, t.ID)
	}
	return ids
}

// TestLiveJSONKeepsTreesTogether: a throttled team brings its organisation
// to the top with it, on the page and in the live JSON (whose order the
// script applies); a tenant page polls its ancestors and children too.
func TestLiveJSONKeepsTreesTogether(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.tenant(t, "alpha", limits(100000, "100"))
	b.tenant(t, "org", limits(100000, "100"))
	team := limits(100000, "100")
	team.MaxConcurrent = 1
	b.tenant(t, "zeta", limits(100000, "100"))
	b.child(t, "org.team", "org", team)
	b.child(t, "org.team.k", "org.team", limits(100000, "100"))
	b.child(t, "org.other", "org", limits(100000, "100"))
	teamKey := b.keyFor(t, "org.team")
	if rec := b.admit(t, teamKey, 50); rec.Code != http.StatusCreated {
		t.Fatalf("admit: %d %s", rec.Code, rec.Body.String())
	}
	if rec := b.admit(t, teamKey, 50); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("second admission: %d, want 429 by the team's concurrency limit", rec.Code)
	}
	if err := b.rejections.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c := b.client(t, "192.0.2.60")
	c.mustLogin()

	want := []string{"org", "org.team", "org.team.k", "org.other", "alpha", "zeta"}
	if got := c.liveIDs("/ui/overview.json"); !slices.Equal(got, want) {
		t.Errorf("live order %q, want %q", got, want)
	}
	page := c.get("/").Body.String()
	var onPage []string
	for _, part := range strings.Split(page, `<tr data-tenant="`)[1:] {
		id, rest, _ := strings.Cut(part, `"`)
		depth, _, _ := strings.Cut(strings.TrimPrefix(rest, ` data-depth="`), `"`)
		onPage = append(onPage, id+":"+depth)
	}
	if got := strings.Join(onPage, " "); got != "org:0 org.team:1 org.team.k:2 org.other:1 alpha:0 zeta:0" {
		t.Errorf("the overview lists %s", got)
	}
	for path, want := range map[string][]string{
		"/ui/overview.json?tenant=org.team":   {"org", "org.team", "org.team.k"},
		"/ui/overview.json?tenant=org":        {"org", "org.team", "org.other"},
		"/ui/overview.json?tenant=org.team.k": {"org", "org.team", "org.team.k"},
		"/ui/overview.json?tenant=alpha":      {"alpha"},
	} {
		if got := c.liveIDs(path); !slices.Equal(got, want) {
			t.Errorf("%s: %q, want %q", path, got, want)
		}
	}
}

// TestTreeAndShadowFormsNameTheBadField: a parent that cannot take the
// tenant, and a shadow limit that cannot be one, come back as the form's
// errors, with nothing saved; valid ones are saved, each limits change a
// ledger entry.
func TestTreeAndShadowFormsNameTheBadField(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.tenant(t, "l1", limits(1000, "1"))
	b.child(t, "l2", "l1", limits(1000, "1"))
	b.child(t, "l3", "l2", limits(1000, "1"))
	b.child(t, "l4", "l3", limits(1000, "1"))
	c := b.client(t, "192.0.2.61")
	c.mustLogin()
	csrf := c.csrf("/")

	overview := c.get("/?parent=l2").Body.String()
	for _, want := range []string{`<option value="l1">l1</option>`, `<option value="l2" selected>l1 / l2</option>`, `<option value="l3">l1 / l2 / l3</option>`} {
		if !strings.Contains(overview, want) {
			t.Errorf("the create form lacks %s", want)
		}
	}
	if strings.Contains(overview, `<option value="l4"`) {
		t.Error("the create form offers l4, at the deepest level, as a parent")
	}
	for _, tc := range []struct {
		path string
		form url.Values
		want string
	}{
		{"/tenants", url.Values{"id": {"l5"}, "parent": {"l4"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1"}}, "parent: budgets nest at most 4 levels"},
		{"/tenants", url.Values{"id": {"n1"}, "parent": {"nope"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1"}}, "parent: no tenant has the id &#34;nope&#34;"},
		{"/tenants", url.Values{"id": {"n2"}, "parent": {"n2"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1"}}, "parent: a tenant cannot be its own parent"},
		{"/tenants", url.Values{"id": {"n3"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1"}, "shadow": {"tokens", "period_budget"}}, "shadow: period_budget is not configured"},
		{"/tenants/l1/limits", url.Values{"tokens_capacity": {"10"}, "tokens_per_second": {"1"}, "shadow": {"concurrency"}}, "shadow: concurrency is not configured, so it cannot be a shadow limit"},
		{"/tenants/l1/limits", url.Values{"tokens_capacity": {"10"}, "tokens_per_second": {"1"}, "shadow": {"bogus"}}, "shadow: unknown limit &#34;bogus&#34;"},
	} {
		tc.form.Set("csrf", csrf)
		rec := c.post(tc.path, tc.form)
		if rec.Code != http.StatusUnprocessableEntity || strings.Count(rec.Body.String(), tc.want) != 2 { // the summary and the field
			t.Errorf("POST %s %v: %d, want 422 naming %q at the top and at the field", tc.path, tc.form, rec.Code, tc.want)
		}
	}
	// The refused form keeps what was sent: the parent and the boxes.
	rec := c.post("/tenants", url.Values{"csrf": {csrf}, "id": {"l5"}, "parent": {"l4"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1"}, "shadow": {"tokens"}})
	if body := rec.Body.String(); !strings.Contains(body, `<option value="l4" selected>l4</option>`) || !strings.Contains(body, `value="tokens" checked>`) {
		t.Error("the refused create form lost its parent or its shadow box")
	}
	if n := b.count(t, `SELECT count(*) FROM tenants`); n != 4 {
		t.Errorf("%d tenants after refused forms, want 4", n)
	}
	if n := b.count(t, `SELECT count(*) FROM ledger_entries WHERE kind = 'limits'`); n != 0 {
		t.Errorf("%d limits entries after refused forms", n)
	}

	// Valid: a shadow tenant under l3, and l1's limits with two shadow limits.
	rec = c.post("/tenants", url.Values{"csrf": {csrf}, "id": {"l4b"}, "parent": {"l3"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1"}, "shadow": {"tokens"}})
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("create under l3: %d %s", rec.Code, rec.Body.String())
	}
	s, err := b.store.TenantSnapshot(ctx, "l4b")
	if err != nil || !slices.Equal(s.Path, []string{"l1", "l2", "l3"}) || !slices.Equal(s.Limits.Shadow.Strings(), []string{"tokens"}) {
		t.Fatalf("l4b: %+v %v", s, err)
	}
	rec = c.post("/tenants/l1/limits", url.Values{"csrf": {csrf}, "tokens_capacity": {"1000"}, "tokens_per_second": {"1"},
		"period_budget": {"5000"}, "period": {"day"}, "shadow": {"period_budget", "tokens"}})
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("limits with shadows: %d %s", rec.Code, rec.Body.String())
	}
	if s, _ := b.store.TenantSnapshot(ctx, "l1"); !slices.Equal(s.Limits.Shadow.Strings(), []string{"tokens", "period_budget"}) {
		t.Errorf("l1's shadow limits: %q", s.Limits.Shadow.Strings())
	}
	if n := b.count(t, `SELECT count(*) FROM ledger_entries WHERE tenant_id = 'l1' AND kind = 'limits' AND actor = 'admin:oncall'
		AND detail::jsonb->'after'->'shadow' = '["tokens", "period_budget"]'::jsonb AND NOT detail::jsonb->'before' ? 'shadow'`); n != 1 {
		t.Errorf("%d limits entries recording the shadow change, want 1", n)
	}
	l1 := c.get("/tenants/l1").Body.String()
	for _, want := range []string{`value="tokens" checked>`, `value="period_budget" checked>`, `<a href="/?parent=l1#create-tenant-section" id="nest">`} {
		if !strings.Contains(l1, want) {
			t.Errorf("l1's page lacks %s", want)
		}
	}
	if strings.Contains(l1, `value="requests" checked`) {
		t.Error("l1's page ticks requests")
	}
	if l4 := c.get("/tenants/l4").Body.String(); strings.Contains(l4, `id="nest"`) {
		t.Error("l4, at the deepest level, offers to nest a tenant")
	}
}
