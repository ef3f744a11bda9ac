package lease_test

import (
	"context"
	"errors"
	"testing"

	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// A tenant's lease mode is off until set; a change is one limits entry
// under its lock (none when it does not change), and the answer names the
// rule that keeps the tenant exact whatever its mode.
func TestMode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenantOff(t, "org", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok, MaxConcurrent: 2})
	b.tenantOff(t, "acme", "org", rule.Limits{TokensCapacity: 500, TokensRateMicro: tok})
	b.tenantOff(t, "solo", "", rule.Limits{TokensCapacity: 500, TokensRateMicro: tok})
	ls := b.r.leases

	if m, err := ls.ModeOf(ctx, "solo"); err != nil || m != lease.ModeOff {
		t.Fatalf("mode of a new tenant: %q, %v; want off", m, err)
	}
	// A tenant in mode off is never leased, whatever a replica's copy of
	// the modes says.
	var eo *lease.ExactOnlyError
	if _, err := ls.Take(ctx, lease.TakeParams{TenantID: "solo", WantMicro: 10 * tok}); !errors.As(err, &eo) || eo.Rule != "lease mode off" {
		t.Fatalf("take of a tenant in mode off: %v, want the exact-only error of its mode", err)
	}
	st, err := ls.SetMode(ctx, lease.SetModeParams{TenantID: "solo", Mode: lease.ModeAuto, Actor: "ops"})
	if err != nil || st.Mode != lease.ModeAuto || st.ExactOnly != "" {
		t.Fatalf("set auto: %+v, %v", st, err)
	}
	if _, err := ls.SetMode(ctx, lease.SetModeParams{TenantID: "solo", Mode: lease.ModeAuto}); err != nil {
		t.Fatal(err)
	}
	if m, err := ls.ModeOf(ctx, "solo"); err != nil || m != lease.ModeAuto {
		t.Fatalf("mode after set: %q, %v; want auto", m, err)
	}
	if n, delta, _ := b.kindSum(t, "solo", ledger.KindLimits); n != 1 || delta != 0 {
		t.Errorf("%d limits entries moving %d; want 1 (the change, not the repeat) moving 0", n, delta)
	}
	// Auto, then off again: the off ends the lease, and no take after it
	// succeeds, on any replica: the take reads the mode under the row lock
	// the off took, not a replica's copy of the modes (read every 2 s).
	l, err := ls.Take(ctx, lease.TakeParams{TenantID: "solo", WantMicro: 10 * tok})
	if err != nil {
		t.Fatalf("take in mode auto: %v", err)
	}
	other := b.replica(t, "r1", 2)
	if _, err := ls.SetMode(ctx, lease.SetModeParams{TenantID: "solo", Mode: lease.ModeOff}); err != nil {
		t.Fatal(err)
	}
	if state, _, _, _ := b.leaseState(t, l.ID); state != "returned" {
		t.Fatalf("the lease after mode off: %s, want returned", state)
	}
	if _, err := other.leases.Take(ctx, lease.TakeParams{TenantID: "solo", WantMicro: 10 * tok}); !errors.As(err, &eo) || eo.Rule != "lease mode off" {
		t.Fatalf("take after mode off by a replica whose copy says auto: %v, want the exact-only error of its mode", err)
	}
	if _, err := ls.SetMode(ctx, lease.SetModeParams{TenantID: "solo", Mode: lease.ModeAuto}); err != nil {
		t.Fatal(err)
	}
	b.verify(t, "solo")

	st, err = ls.SetMode(ctx, lease.SetModeParams{TenantID: "acme", Mode: lease.ModeAuto})
	if err != nil || st.ExactOnlyTenant != "org" || st.ExactOnly != "concurrency limit" {
		t.Fatalf("set auto below a concurrency limit: %+v, %v; want it named", st, err)
	}

	var le *rule.LimitError
	if _, err := ls.SetMode(ctx, lease.SetModeParams{TenantID: "solo", Mode: "sometimes"}); !errors.As(err, &le) || le.Field != "lease" {
		t.Errorf("set a bogus mode: %v, want a LimitError on lease", err)
	}
	if _, err := ls.SetMode(ctx, lease.SetModeParams{TenantID: "nobody", Mode: lease.ModeAuto}); !errors.Is(err, rule.ErrTenantNotFound) {
		t.Errorf("set the mode of an unknown tenant: %v", err)
	}
	if _, err := ls.ModeOf(ctx, "nobody"); !errors.Is(err, rule.ErrTenantNotFound) {
		t.Errorf("mode of an unknown tenant: %v", err)
	}
}
