package account_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// The attack of issue 21: cost-1 reservations settled with a billion
// prompt and completion tokens each. Every settle is refused, and nothing
// moves: not the balance, not the ledger.
func TestSettleAbsurdUsageRefused(t *testing.T) {
	t.Parallel()
	b, _ := setupFrozen(t)
	b.tenant(t, "acme", limits(10_000_000, "1000"))
	r := b.mustReserve(t, "acme", 1) // gpt-4o, 0 input + 1 output reserved
	before := b.state(t, "acme")
	for _, u := range []struct {
		in, out int64
		field   string
	}{
		{1_000_000_000, 1_000_000_000, "completion_tokens"},
		{1_000_000_000, 1, "prompt_tokens"},
		{128_000, 1, "prompt_tokens"}, // one past gpt-4o's window of 128000
		{0, 2, "completion_tokens"},   // one past the output reserved
		{-1, 0, "prompt_tokens"},
		{0, -1, "completion_tokens"},
	} {
		_, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: u.in, OutputTokens: u.out})
		var ue *rule.UsageError
		if !errors.As(err, &ue) || !errors.Is(err, rule.ErrUsageOutOfBounds) || ue.Field != u.field {
			t.Fatalf("settle %d/%d: %v, want a *UsageError on %s", u.in, u.out, err, u.field)
		}
		if after := b.state(t, "acme"); after != before {
			t.Fatalf("settle %d/%d moved something:\n%+v\n%+v", u.in, u.out, before, after)
		}
	}
	// At the bound it settles: the whole window, the output reserved.
	s, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 127_999, OutputTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	if s.DeltaMicro != -127_999*rule.Micro {
		t.Fatalf("settle at the bound: delta %d", s.DeltaMicro)
	}
	b.verify(t, "acme")
}

// A model the table does not know, at the largest weight (1000): its
// usage is held to MaxUnknownModelUsage, and the charges stop at the debt
// floor, minus one capacity, where five settles would have wrapped int64
// without the bound.
func TestSettleHeavyModelStopsAtDebtFloor(t *testing.T) {
	t.Parallel()
	b, _ := setupFrozen(t)
	const capacity = 10_000_000
	b.tenant(t, "acme", limits(capacity, "1"))
	heavy := estimator.Estimate{Model: "heavy-model", Family: estimator.UnknownFamily, InputTokens: 0, OutputTokens: 1, Cost: 1000,
		InputWeightMicro: 1000 * estimator.WeightOne, OutputWeightMicro: 1000 * estimator.WeightOne}
	for i := range 5 {
		r, err := b.store.Reserve(ctx, account.ReserveParams{TenantID: "acme", Estimate: heavy})
		if i > 0 {
			rejected(t, err, rule.LimitTokens) // in debt: refused
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		before := b.state(t, "acme")
		_, err = b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 1_000_000_000, OutputTokens: 1})
		if !errors.Is(err, rule.ErrUsageOutOfBounds) {
			t.Fatalf("1e9 tokens of an unknown model: %v", err)
		}
		if b.state(t, "acme") != before {
			t.Fatal("a refused settle moved something")
		}
		s, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID,
			InputTokens: rule.MaxUnknownModelUsage - 1, OutputTokens: 1})
		if err != nil {
			t.Fatal(err)
		}
		// 2e9 tokens charged at weight 1000: far past the floor; it stops there.
		if s.BalanceMicro != -capacity*rule.Micro {
			t.Fatalf("balance %d, want the floor %d", s.BalanceMicro, -capacity*rule.Micro)
		}
	}
	b.verify(t, "acme")
}

// An admin's debit may not take a balance below the floor, and an amount
// or a credit that would overflow is refused; neither moves anything.
func TestAdjustDebtFloorAndOverflow(t *testing.T) {
	t.Parallel()
	b, _ := setupFrozen(t)
	b.tenant(t, "acme", limits(1000, "1"))
	before := b.state(t, "acme")
	if _, err := b.store.Adjust(ctx, account.AdjustParams{TenantID: "acme", Tokens: -2001, Reason: "too much"}); !errors.Is(err, rule.ErrDebtFloor) {
		t.Fatalf("debit past the floor: %v", err)
	}
	var oe *rule.OverflowError
	if _, err := b.store.Adjust(ctx, account.AdjustParams{TenantID: "acme", Tokens: -2_000_000_000_000, Reason: "huge"}); !errors.As(err, &oe) || oe.Field != "tokens" {
		t.Fatalf("a huge debit: %v", err)
	}
	if b.state(t, "acme") != before {
		t.Fatal("a refused adjustment moved something")
	}
	// To the floor exactly is allowed; one more token is not.
	snap, err := b.store.Adjust(ctx, account.AdjustParams{TenantID: "acme", Tokens: -2000, Reason: "to the floor"})
	if err != nil || snap.TokensMicro != -1000*rule.Micro {
		t.Fatalf("debit to the floor: %+v %v", snap.TokensMicro, err)
	}
	if _, err := b.store.Adjust(ctx, account.AdjustParams{TenantID: "acme", Tokens: -1, Reason: "one more"}); !errors.Is(err, rule.ErrDebtFloor) {
		t.Fatalf("debit below the floor: %v", err)
	}
	// Credits of 1e12 tokens until the balance would leave int64.
	var err2 error
	for range 20 {
		if _, err2 = b.store.Adjust(ctx, account.AdjustParams{TenantID: "acme", Tokens: 1_000_000_000_000, Reason: "credit"}); err2 != nil {
			break
		}
	}
	if !errors.Is(err2, rule.ErrOverflow) {
		t.Fatalf("credits past int64: %v", err2)
	}
	b.verify(t, "acme")
}

// Many goroutines over two replicas settle with extra charges up to the
// model's window and debit by hand, all near the floor: the balance never
// goes below minus one capacity, at any entry, and the ledger recomputes
// the row exactly.
func TestConcurrentChargesNeverPassTheFloor(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	const capacity = 1000
	b.tenant(t, "acme", limits(capacity, "0.001"))
	var refusedFloor, settled int
	results := make(chan error, 400)
	hammer(stores, func(g int, s *account.Store) {
		if g%4 == 0 {
			_, err := s.Adjust(ctx, account.AdjustParams{TenantID: "acme", Tokens: -int64(100 + g), Reason: "debit"})
			results <- err
			return
		}
		r, err := s.Reserve(ctx, reserveFor("acme", 4))
		if errors.Is(err, rule.ErrRejected) {
			return
		}
		if err != nil {
			results <- err
			return
		}
		_, err = s.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: int64(100 * g), OutputTokens: 2})
		results <- err
	})
	close(results)
	for err := range results {
		switch {
		case err == nil:
			settled++
		case errors.Is(err, rule.ErrDebtFloor):
			refusedFloor++
		default:
			t.Fatal(err)
		}
	}
	if refusedFloor == 0 {
		t.Fatal("no debit met the floor: the test does not reach it")
	}
	var minBalance, balance int64
	if err := b.pool.QueryRow(ctx, `SELECT min(balance_micro) FROM ledger_entries WHERE tenant_id = 'acme'`).Scan(&minBalance); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(ctx, `SELECT tokens_micro FROM tenants WHERE id = 'acme'`).Scan(&balance); err != nil {
		t.Fatal(err)
	}
	if minBalance < -capacity*rule.Micro || balance < -capacity*rule.Micro {
		t.Fatalf("balance went below the floor: min %d, now %d, floor %d", minBalance, balance, -capacity*rule.Micro)
	}
	b.verify(t, "acme")
	t.Logf("%d settled or debited, %d debits refused at the floor, lowest balance %d", settled, refusedFloor, minBalance)
}

// A local admission replayed into a tenant at the debt floor is written,
// but its debit stops at the floor, and the entry says so.
func TestReplayStopsAtTheDebtFloor(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	b.tenant(t, "acme", limits(100, "1"))
	if _, err := b.store.Adjust(ctx, account.AdjustParams{TenantID: "acme", Tokens: -150, Reason: "to -50"}); err != nil {
		t.Fatal(err)
	}
	now := clock.Now()
	p := reserve(80).Estimate
	wrote, err := b.store.ReplayReserve(ctx, account.ReplayReserveParams{AdmissionID: rule.NewLocalAdmissionID(now), TenantID: "acme",
		Estimate: p, CreatedAt: now, ExpiresAt: now.Add(time.Minute), Replica: "r1"})
	if err != nil || !wrote {
		t.Fatalf("replay: %v %v", wrote, err)
	}
	var balance int64
	if err := b.pool.QueryRow(ctx, `SELECT tokens_micro FROM tenants WHERE id = 'acme'`).Scan(&balance); err != nil {
		t.Fatal(err)
	}
	if balance != -100*rule.Micro {
		t.Fatalf("balance %d, want the floor", balance)
	}
	b.verify(t, "acme")
}
