package web_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/ledger"
)

// TestBrowserLeaseMode: in Chromium, an admin sets a tenant's lease mode
// on its page: auto is stored and shown; auto for a tenant a rule keeps
// exact says so; off ends the tenant's live lease at once (returned, its
// unused part given back with a lease_return entry) and the ledger
// verifies.
func TestBrowserLeaseMode(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	base := serve(t, b)
	br := startBrowser(t, base)
	b.tenant(t, "acme", limits(1000, "1"))
	l := limits(1000, "1")
	l.MaxConcurrent = 3
	b.tenant(t, "capped", l)
	br.login(b.adminSecret)

	br.navigate("/tenants/acme")
	if got := br.texts(`[document.querySelector('#lease-current').textContent]`)[0]; !strings.HasPrefix(got, "Off") {
		t.Fatalf("a new tenant's lease mode reads %q", got)
	}
	br.do("set the lease mode to auto",
		chromedp.SetValue(chromedp.CSS("#lease-mode"), "auto"),
		submit(`#lease-form button[type="submit"]`))
	br.flash("Lease mode saved.")
	if got := br.texts(`[document.querySelector('#lease-current').textContent]`)[0]; !strings.HasPrefix(got, "Auto") {
		t.Fatalf("after the save the page reads %q", got)
	}
	var mode string
	if err := b.pool.QueryRow(ctx, "SELECT mode FROM lease_modes WHERE tenant_id = 'acme'").Scan(&mode); err != nil || mode != "auto" {
		t.Fatalf("stored mode %q, %v", mode, err)
	}

	// A live lease of acme, taken by a replica.
	ls, err := lease.New(lease.Config{Store: b.store, Holder: "r0"})
	if err != nil {
		t.Fatal(err)
	}
	taken, err := ls.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 400_000_000})
	if err != nil {
		t.Fatal(err)
	}
	br.navigate("/tenants/acme")
	br.do("set the lease mode to off",
		chromedp.SetValue(chromedp.CSS("#lease-mode"), "off"),
		submit(`#lease-form button[type="submit"]`))
	br.flash("Lease mode saved. Setting it off ended")
	var state string
	if err := b.pool.QueryRow(ctx, "SELECT state FROM leases WHERE id = $1", taken.ID).Scan(&state); err != nil || state != "returned" {
		t.Fatalf("the lease after off: %q, %v", state, err)
	}
	// The refund is capped at capacity, which the refill since the take
	// may have nearly reached.
	var n, back int64
	if err := b.pool.QueryRow(ctx, "SELECT count(*), coalesce(sum(delta_micro), 0) FROM ledger_entries WHERE tenant_id = 'acme' AND kind = $1", string(ledger.KindLeaseReturn)).Scan(&n, &back); err != nil || n != 1 || back <= 0 || back > 400_000_000 {
		t.Fatalf("%d lease_return entries giving back %d, %v; want one giving back the unused slice", n, back, err)
	}
	if res, err := b.store.Audit(ctx, "acme"); err != nil || len(res) != 1 || !res[0].OK {
		t.Fatalf("ledger verify: %+v, %v", res, err)
	}

	br.navigate("/tenants/capped")
	br.do("set auto on a tenant with a concurrency limit",
		chromedp.SetValue(chromedp.CSS("#lease-mode"), "auto"),
		submit(`#lease-form button[type="submit"]`))
	br.flash("Lease mode saved, but a rule of this tenant's tree")
	br.noViolations("the tenant page")
}
