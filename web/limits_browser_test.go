package web_test

import (
	"reflect"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// TestBrowserLimitsFormKeepsOthersChanges: in Chromium, an admin opens a
// tenant's limits form; another admin then changes max_concurrent and
// removes the request bucket. The first admin edits tokens_capacity and
// saves: the other admin's changes stay, because the form sends only the
// field that was edited. A refused edit comes back naming its field.
func TestBrowserLimitsFormKeepsOthersChanges(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	base := serve(t, b)
	br := startBrowser(t, base)
	l := limits(1000, "1")
	l.MaxConcurrent, l.RequestsCapacity, l.RequestsRateMicro = 4, 10, 2_000_000
	b.tenant(t, "acme", l)
	br.login(b.adminSecret)
	br.navigate("/tenants/acme")

	if _, err := b.store.UpdateLimits(ctx, account.UpdateLimitsParams{TenantID: "acme", Actor: "other",
		Patch: rule.LimitsPatch{MaxConcurrent: rule.Set[int64](9), RequestsCapacity: rule.Unset[int64]()}}); err != nil {
		t.Fatal(err)
	}
	br.do("save tokens_capacity",
		chromedp.SetValue(chromedp.CSS("#lim-tokens_capacity"), "2000"),
		submit(`#limits button[type="submit"]`))
	br.flash("Limits saved.")
	s, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if l := s.Limits; l.TokensCapacity != 2000 || l.MaxConcurrent != 9 || l.RequestsCapacity != 0 {
		t.Fatalf("after saving tokens_capacity in the browser: %+v; want 2000, and the other admin's max_concurrent 9 and no request bucket", l)
	}

	br.do("set max_concurrent 0",
		chromedp.SetValue(chromedp.CSS("#lim-max_concurrent"), "0"),
		submit(`#limits button[type="submit"]`))
	if errs := br.formErrors("#limits"); len(errs) == 0 || errs[0] != "max_concurrent: must be between 1 and 2147483647 (blank removes the cap)" {
		t.Fatalf("max_concurrent 0: %q", errs)
	}
	if s2, _ := b.store.TenantSnapshot(ctx, "acme"); !reflect.DeepEqual(s2.Limits, s.Limits) {
		t.Fatalf("a refused form changed %+v into %+v", s.Limits, s2.Limits)
	}
}
