package migrations_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// TestPeriodBudgetsBecomeWindows: a tenant with today's period budget (a
// day, UTC), part spent, is upgraded to windows: it keeps its budget as the
// window "period", what it spent this day, and its chain, which still
// verifies (old entries hash as they did); and it decides as before.
func TestPeriodBudgetsBecomeWindows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, m := migratorAt(t, 15)
	now := time.Date(2026, 12, 4, 15, 0, 0, 0, time.UTC)
	day := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	// As the release before wrote them: a tenant with a period budget of
	// 100 a day, 60 of it spent today; one without.
	if _, err := pool.Exec(ctx, `
		INSERT INTO tenants (id, tokens_capacity, tokens_rate_micro, reservation_ttl_ms, tokens_micro, tokens_at, created_at,
		                     period_budget, period, period_start, period_used)
		VALUES ('acme', 1000, 1000000, 600000, 1000000000, $1, $1, 100, 'day', $2, 60),
		       ('plain', 1000, 1000000, 600000, 1000000000, $1, $1, NULL, NULL, NULL, 0)`, now, day); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	store := account.NewStore(pool).WithClock(func() time.Time { return now })
	snap, err := store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if snap.Limits.PeriodBudget != 100 || snap.Limits.Period != rule.PeriodDay || len(snap.Limits.Windows) != 1 ||
		snap.Limits.Windows[0].Name != "period" || snap.PeriodUsed != 60 || !snap.PeriodStart.Equal(day) {
		t.Fatalf("after the upgrade: %+v", snap)
	}
	reserve := func(id string, cost int64) error {
		_, err := store.Reserve(ctx, account.ReserveParams{TenantID: id, Estimate: estimatorEstimate(cost)})
		return err
	}
	var rej *rule.RejectedError
	if err := reserve("acme", 41); !errors.As(err, &rej) || rej.Window != "period" || rej.RetryAfter != 9*time.Hour {
		t.Fatalf("41 more of a day budget of 100 with 60 spent: %v", err)
	}
	if err := reserve("acme", 40); err != nil {
		t.Fatal(err)
	}
	if err := reserve("plain", 500); err != nil {
		t.Fatal(err)
	}
	var windows string
	var used int64
	if err := pool.QueryRow(ctx, `SELECT windows, period_used FROM ledger_entries WHERE tenant_id = 'acme' ORDER BY seq DESC LIMIT 1`).Scan(&windows, &used); err != nil {
		t.Fatal(err)
	}
	if windows != "period=100" || used != 100 {
		t.Fatalf("the entry records windows %q, period_used %d", windows, used)
	}
}

func estimatorEstimate(cost int64) estimator.Estimate {
	return estimator.Estimate{Model: "gpt-4o", InputTokens: cost, Cost: cost, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}
}
