package ledger_test

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
	"github.com/tokengate/tokengate/ledger/ledgertest"
)

// TestVerifyReportsOverflow: a history whose balance wrapped past int64,
// with every hash valid, is an overflow at the entry that wrapped. Before
// issue 21 the verifier wrapped the same way and found nothing.
func TestVerifyReportsOverflow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 1000, TokensRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	w := ledgertest.Wrap(t, pool, "acme", "gpt-4o")
	if w.WrappedBalance <= 0 || w.ExactBalance.Sign() >= 0 {
		t.Fatalf("the history did not wrap: stored %d, exact %s", w.WrappedBalance, w.ExactBalance)
	}
	tally, err := ledger.Verify(ctx, pool, "acme")
	var p *ledger.Problem
	if !errors.As(err, &p) || !errors.Is(err, ledger.ErrBroken) {
		t.Fatalf("verify of a wrapped ledger: %+v %v, want an overflow problem", tally, err)
	}
	if p.Kind != ledger.ProblemOverflow || p.Seq != w.OverflowSeq || p.TenantID != "acme" {
		t.Fatalf("problem %+v, want kind overflow at entry %d", p, w.OverflowSeq)
	}
	if tally.LastSeq != w.OverflowSeq-1 {
		t.Fatalf("tally ends at entry %d, want the entry before the overflow (%d)", tally.LastSeq, w.OverflowSeq-1)
	}
	// Continuing from the last good tally finds it again.
	if _, err := ledger.VerifyFrom(ctx, pool, "acme", tally, 0); !errors.As(err, &p) || p.Kind != ledger.ProblemOverflow {
		t.Fatalf("verify from entry %d: %v, want the overflow", tally.LastSeq, err)
	}
}

// TestVerifyKindsOfProblems: a forged amount with a recomputed hash is an
// arithmetic problem, a changed amount alone a chain problem.
func TestVerifyKindsOfProblems(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	for _, id := range []string{"a", "b"} {
		if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: rule.Limits{TokensCapacity: 1000, TokensRateMicro: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE ledger_rows DISABLE TRIGGER USER;
		UPDATE ledger_rows SET balance_micro = balance_micro + 1 WHERE tenant_id = 'a';
		UPDATE ledger_rows e SET balance_micro = balance_micro + 1 WHERE tenant_id = 'b';
		UPDATE ledger_rows e SET hash = sha256(prev_hash || ledger_canonical(e)) WHERE tenant_id = 'b';
		ALTER TABLE ledger_rows ENABLE TRIGGER USER`); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]ledger.ProblemKind{"a": ledger.ProblemChain, "b": ledger.ProblemArithmetic} {
		_, err := ledger.Verify(ctx, pool, id)
		var p *ledger.Problem
		if !errors.As(err, &p) || p.Kind != want || p.Seq != 1 {
			t.Errorf("tenant %s: %v, want a %s problem at entry 1", id, err, want)
		}
	}
}

func TestTokensRendersEveryInt64(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		micro int64
		want  string
	}{
		{0, "0"},
		{1, "0.000001"},
		{-1_500_000, "-1.5"},
		{math.MaxInt64, "9223372036854.775807"},
		{math.MinInt64, "-9223372036854.775808"},
		{math.MinInt64 + 1, "-9223372036854.775807"},
	} {
		if got := ledger.Tokens(c.micro); got != c.want {
			t.Errorf("Tokens(%d) = %q, want %q", c.micro, got, c.want)
		}
	}
}
