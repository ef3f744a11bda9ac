package admin_test

import (
	"context"
	"errors"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// Concurrent sets of one tenant's lease mode from many callers change it
// once: exactly one limits entry, and the chain verifies.
func TestTenantLeaseModeConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.svc.TenantCreate(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 100, TokensRateMicro: rule.Micro}}); err != nil {
		t.Fatal(err)
	}
	if m, err := b.svc.TenantLeaseMode(ctx, "acme"); err != nil || m != lease.ModeOff {
		t.Fatalf("mode of a new tenant: %q, %v", m, err)
	}
	for i, err := range together(16, func(int) error {
		_, err := b.svc.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: "acme", Mode: lease.ModeAuto, Actor: "ops"})
		return err
	}) {
		if err != nil {
			t.Fatalf("set %d: %v", i, err)
		}
	}
	if m, err := b.svc.TenantLeaseMode(ctx, "acme"); err != nil || m != lease.ModeAuto {
		t.Fatalf("mode after the sets: %q, %v", m, err)
	}
	entries, _, err := b.svc.LedgerQuery(ctx, ledger.Filter{TenantID: "acme", Kind: ledger.KindLimits})
	if err != nil || len(entries) != 1 || entries[0].Actor != "ops" {
		t.Fatalf("limits entries: %d, %v; want exactly one, by ops", len(entries), err)
	}
	res, err := b.svc.LedgerVerify(ctx, "acme")
	if err != nil || len(res) != 1 || !res[0].OK {
		t.Fatalf("ledger verify: %+v, %v", res, err)
	}
	var le *rule.LimitError
	if _, err := b.svc.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: "acme", Mode: "on"}); !errors.As(err, &le) || le.Field != "lease" {
		t.Fatalf("set mode on: %v, want a LimitError on lease", err)
	}
}
