package budget_test

import (
	"math"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget"
)

func TestDriftReport(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(10_000, "0.001"))
	b.tenant(t, "globex", limits(10_000, "0.001"))
	settle := func(r *budget.Reservation, in, out int64) {
		t.Helper()
		if _, err := b.store.Settle(ctx, budget.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: in, OutputTokens: out}); err != nil {
			t.Fatal(err)
		}
	}
	settle(b.mustReserve(t, "acme", 100), 40, 40) // actual 80: +25 % error, 20 refunded
	settle(b.mustReserve(t, "acme", 100), 75, 50) // actual 125: -20 %, 25 extra
	r3 := b.mustReserve(t, "acme", 50)
	if _, err := b.store.Release(ctx, budget.ReleaseParams{TenantID: "acme", AdmissionID: r3.AdmissionID}); err != nil {
		t.Fatal(err)
	}
	r4 := b.mustReserve(t, "acme", 30)
	if _, err := b.pool.Exec(ctx, `UPDATE admissions SET expires_at = clock_timestamp() - interval '1 s' WHERE id = $1`, r4.AdmissionID); err != nil {
		t.Fatal(err)
	}
	if n, err := b.store.SweepOnce(ctx, nil); err != nil || n != 1 {
		t.Fatalf("sweep: %d %v", n, err)
	}
	settle(r4, 10, 10) // late; actual 20: +50 %, 10 refunded
	b.mustReserve(t, "globex", 10)

	rows, err := b.store.DriftReport(ctx, budget.DriftParams{TenantID: "acme", From: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("rows: %+v", rows)
	}
	d := rows[0]
	want := budget.DriftRow{TenantID: "acme", Model: "gpt-4o", Admissions: 4, EstimatedInput: 140, EstimatedOutput: 140,
		EstimatedCost: 280, ActualInput: 125, ActualOutput: 100, ActualCost: 225, Settled: 3, Expired: 1,
		RefundedMicro: 80 * budget.Micro, ExtraChargedMicro: 25 * budget.Micro}
	mean, p95 := d.MeanRelativeError, d.P95AbsRelativeErr
	d.MeanRelativeError, d.P95AbsRelativeErr = 0, 0
	if d != want {
		t.Fatalf("report\n got %+v\nwant %+v", d, want)
	}
	if math.Abs(mean-(0.25-0.2+0.5)/3) > 1e-9 || math.Abs(p95-0.475) > 1e-9 {
		t.Fatalf("mean %.6f (want 0.183333), p95 %.6f (want 0.475)", mean, p95)
	}
	all, err := b.store.DriftReport(ctx, budget.DriftParams{From: time.Now().Add(-time.Hour)})
	if err != nil || len(all) != 2 || all[1].TenantID != "globex" || all[1].Settled != 0 {
		t.Fatalf("all tenants: %+v %v", all, err)
	}
	byModel, err := b.store.DriftReport(ctx, budget.DriftParams{From: time.Now().Add(-time.Hour), ByModel: true})
	if err != nil || len(byModel) != 1 || byModel[0].TenantID != "*" || byModel[0].Admissions != 5 || byModel[0].Settled != 3 {
		t.Fatalf("by model: %+v %v", byModel, err)
	}
	none, err := b.store.DriftReport(ctx, budget.DriftParams{From: time.Now().Add(time.Hour)})
	if err != nil || len(none) != 0 {
		t.Fatalf("future range: %+v %v", none, err)
	}
}
