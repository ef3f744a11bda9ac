package web_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// TestTenantPageShowsEndUsers: the tenant page shows its end-user policy
// and its end users (an expired one marked), and its budget tree leaves
// them out; a tenant without a policy says so.
func TestTenantPageShowsEndUsers(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.tenant(t, "acme", limits(100000, "100"))
	b.tenant(t, "plain", limits(100000, "100"))
	if _, err := b.store.EndUserPolicySet(ctx, account.EndUserPolicyParams{TenantID: "acme", Source: rule.SourceHeader, Header: "x-end-user",
		Template: limits(2500, "0.5"), MaxEndUsers: 7, IdleTTL: 2 * time.Hour, Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, u := range []string{"alice@example.com", "bob"} {
		id, err := b.store.EndUserEnsure(ctx, "acme", u)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE tenants SET end_user_expired_at = now() WHERE id = $1`, ids[1]); err != nil {
		t.Fatal(err)
	}
	c := b.client(t, "192.0.2.70")
	c.mustLogin()
	rec := c.get("/tenants/acme")
	page := rec.Body.String()
	if rec.Code != http.StatusOK {
		t.Fatalf("%d %s", rec.Code, page)
	}
	section := page[strings.Index(page, `id="end-users-section"`):]
	section = section[:strings.Index(section, "</section>")]
	for _, want := range []string{"the X-End-User header", "2,500 tokens, refilling 0.5/s", `data-field="max_end_users">7<`, "2h",
		`data-end-user="alice@example.com"`, `data-end-user="bob"`, "/tenants/" + ids[0], "2,500 / 2,500"} {
		if !strings.Contains(section, want) {
			t.Fatalf("the end-user section lacks %q:\n%s", want, section)
		}
	}
	if strings.Count(section, `<td data-field="expired">-</td>`) != 1 {
		t.Fatalf("one end user is expired, one is not:\n%s", section)
	}
	tree := page[strings.Index(page, `id="tree-section"`):]
	tree = tree[:strings.Index(tree, "</section>")]
	if strings.Contains(tree, ids[0]) {
		t.Fatal("the budget tree lists end users")
	}
	// An end user's own page works (its tree is its tenant and itself).
	if rec := c.get("/tenants/" + ids[0]); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), ids[0]) {
		t.Fatalf("end user page: %d", rec.Code)
	}
	if rec := c.get("/tenants/plain"); !strings.Contains(rec.Body.String(), "No end-user policy") {
		t.Fatal("a tenant without a policy does not say so")
	}
}
