package lease_test

import (
	"context"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// A renew while a level is in debt (a settle charged more than its
// estimate, or an adjustment) adds nothing to the lease. It used to add
// the negative balance, shrinking the lease's slice with no ledger entry:
// its return then refunded less than the lease had taken and not used, and
// a lease that had used most of its slice could not be renewed at all.
func TestRenewInDebt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
	l, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 300 * tok, MinMicro: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.r.journal.Append(ctx, l.ID, adm("a", 250)); err != nil {
		t.Fatal(err)
	}
	// 700 left; an adjustment of -900 leaves the tenant 200 in debt.
	if _, err := b.r.acct.Adjust(ctx, account.AdjustParams{TenantID: "acme", Tokens: -900, Reason: "debt", Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	r, err := b.r.leases.Renew(ctx, l.ID, 100*tok)
	if err != nil {
		t.Fatalf("renew in debt: %v", err)
	}
	if r.SliceMicro != 300*tok {
		t.Fatalf("renewed slice %d, want the 300 taken (nothing added)", r.SliceMicro)
	}
	if n, _, _ := b.kindSum(t, "acme", ledger.KindLeaseTake); n != 1 {
		t.Fatalf("%d lease_take entries, want the take's only", n)
	}
	unused, err := b.r.leases.Return(ctx, l.ID)
	if err != nil || unused != 50*tok {
		t.Fatalf("return: %d unused, %v; want 50 tokens", unused, err)
	}
	// Taken 300, used 250, 50 back: -200 + 50.
	if got, want := b.balance(t, "acme"), int64(-150)*tok; got != want {
		t.Fatalf("balance %d, want %d", got, want)
	}
	b.verify(t, "acme")
}
