package replica_test

import (
	"context"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
)

// priced is what an admission records of its price and money, and its
// reserve and settle entries' money.
type priced struct {
	model, tier            *string
	from                   *time.Time
	estimate, actual       *int64
	reserveMoney, endMoney *int64
}

func (b *leaseBundle) pricedOf(t *testing.T, tenant, id string) priced {
	t.Helper()
	var p priced
	err := b.pool.QueryRow(context.Background(), `SELECT a.price_model, a.price_tier, a.price_from, a.money_estimate, a.money_actual,
			(SELECT sum(money_micro) FROM ledger_entries WHERE tenant_id = $1 AND admission_id = $2 AND kind = 'reserve'),
			(SELECT sum(money_micro) FROM ledger_entries WHERE tenant_id = $1 AND admission_id = $2 AND kind = 'settle')
		FROM admissions a WHERE a.tenant_id = $1 AND a.id = $2`, tenant, id).
		Scan(&p.model, &p.tier, &p.from, &p.estimate, &p.actual, &p.reserveMoney, &p.endMoney)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The same request admitted in exact mode and from a lease records the
// same price (model, tier, row) and money estimate on its admissions row
// and reserve entry, and after the same settle the same money spent: a
// lease admission is priced as a reserve is (account.PriceAdmission),
// from the price book the replica read with its lease.
func TestLeasePricedAsExact(t *testing.T) {
	t.Parallel()
	b := setupLeasesSlice(t, 1, 1000)
	r := b.reps[0]
	ctx := context.Background()
	// gpt-4o at 2.50 / 10 a million tokens, in effect before the frozen
	// clock's now (a row of the past: inserted as an operator's import is).
	if _, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, effective_from, input_micro, output_micro, created_by)
		VALUES ('gpt-4o', '2025-01-01', 2500000, 10000000, 'test')`); err != nil {
		t.Fatal(err)
	}
	limits := rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1}
	b.tenant(t, "exact", limits, lease.ModeOff)
	b.tenant(t, "acme", limits, lease.ModeAuto)
	b.warm(t, "acme", 5)
	q := req("exact", 400)
	ex, _, err := r.Admitter.Reserve(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	q.TenantID = "acme"
	ls := leaseReserve(t, r, q, 1)
	for _, s := range []struct{ tenant, id string }{{"exact", ex.AdmissionID}, {"acme", ls.AdmissionID}} {
		if _, _, err := r.Admitter.Settle(ctx, admission.FaceAPI, account.SettleParams{TenantID: s.tenant, AdmissionID: s.id, InputTokens: 150, OutputTokens: 70}); err != nil {
			t.Fatal(err)
		}
	}
	pe, pl := b.pricedOf(t, "exact", ex.AdmissionID), b.pricedOf(t, "acme", ls.AdmissionID)
	if pe.estimate == nil || pe.actual == nil || pe.model == nil || pe.from == nil || pe.reserveMoney == nil || pe.endMoney == nil {
		t.Fatalf("the exact admission is not priced: %+v", pe)
	}
	// 200 in, 200 out: 500 + 2000 micro; 150 in, 70 out: 375 + 700.
	if *pe.estimate != 2500 || *pe.actual != 1075 {
		t.Fatalf("exact: money estimate %d, actual %d; want 2500, 1075", *pe.estimate, *pe.actual)
	}
	same := func(what string, a, b any) {
		t.Helper()
		if a != b {
			t.Fatalf("%s: exact %v, lease %v", what, a, b)
		}
	}
	if pl.estimate == nil || pl.actual == nil || pl.model == nil || pl.from == nil || pl.tier == nil || pl.reserveMoney == nil || pl.endMoney == nil {
		t.Fatalf("the lease admission is not priced as the exact one: %+v", pl)
	}
	same("price model", *pe.model, *pl.model)
	same("price tier", *pe.tier, *pl.tier)
	same("price from", pe.from.UTC(), pl.from.UTC())
	same("money estimate", *pe.estimate, *pl.estimate)
	same("money actual", *pe.actual, *pl.actual)
	same("reserve entry's money", *pe.reserveMoney, *pl.reserveMoney)
	same("settle entry's money", *pe.endMoney, *pl.endMoney)
}
