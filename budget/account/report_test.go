package account_test

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger/ledgertest"
)

func TestDriftReport(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(10_000, "0.001"))
	b.tenant(t, "globex", limits(10_000, "0.001"))
	settle := func(r *account.Reservation, in, out int64) {
		t.Helper()
		if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: in, OutputTokens: out}); err != nil {
			t.Fatal(err)
		}
	}
	settle(b.mustReserve(t, "acme", 100), 40, 40) // actual 80: +25 % error, 20 refunded
	settle(b.mustReserve(t, "acme", 100), 75, 50) // actual 125: -20 %, 25 extra
	r3 := b.mustReserve(t, "acme", 50)
	if _, err := b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: r3.AdmissionID}); err != nil {
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

	rows, err := b.store.DriftReport(ctx, account.DriftParams{TenantID: "acme", From: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("rows: %+v", rows)
	}
	d := rows[0]
	n := account.NewTotal
	want := account.DriftRow{TenantID: "acme", Model: "gpt-4o", Admissions: 4, EstimatedInput: n(140), EstimatedOutput: n(140),
		EstimatedCost: n(280), ActualInput: n(125), ActualOutput: n(100), ActualCost: n(225), Settled: 3, Expired: 1,
		RefundedMicro: n(80 * rule.Micro), ExtraChargedMicro: n(25 * rule.Micro)}
	mean, p95 := d.MeanRelativeError, d.P95AbsRelativeErr
	d.MeanRelativeError, d.P95AbsRelativeErr = 0, 0
	if fmt.Sprintf("%+v", d) != fmt.Sprintf("%+v", want) {
		t.Fatalf("report\n got %+v\nwant %+v", d, want)
	}
	if math.Abs(mean-(0.25-0.2+0.5)/3) > 1e-9 || math.Abs(p95-0.475) > 1e-9 {
		t.Fatalf("mean %.6f (want 0.183333), p95 %.6f (want 0.475)", mean, p95)
	}
	all, err := b.store.DriftReport(ctx, account.DriftParams{From: time.Now().Add(-time.Hour)})
	if err != nil || len(all) != 2 || all[1].TenantID != "globex" || all[1].Settled != 0 {
		t.Fatalf("all tenants: %+v %v", all, err)
	}
	byModel, err := b.store.DriftReport(ctx, account.DriftParams{From: time.Now().Add(-time.Hour), ByModel: true})
	if err != nil || len(byModel) != 1 || byModel[0].TenantID != "*" || byModel[0].Admissions != 5 || byModel[0].Settled != 3 {
		t.Fatalf("by model: %+v %v", byModel, err)
	}
	none, err := b.store.DriftReport(ctx, account.DriftParams{From: time.Now().Add(time.Hour)})
	if err != nil || len(none) != 0 {
		t.Fatalf("future range: %+v %v", none, err)
	}
}

// TestDriftReportSumsAreExact: after a history whose sums leave int64 (the
// balance wrapped), the report's sums are exact numerics, where they used
// to fail to scan. Both report shapes, and the JSON they marshal to.
func TestDriftReportSumsAreExact(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(1000, "1"))
	w := ledgertest.Wrap(t, b.pool, "acme", "gpt-4o")
	if w.ExtraChargedMicro.IsInt64() {
		t.Fatalf("the wrapped history's extra charge %s fits an int64: the test proves nothing", w.ExtraChargedMicro)
	}
	for _, byModel := range []bool{false, true} {
		rows, err := b.store.DriftReport(ctx, account.DriftParams{TenantID: "acme", From: time.Now().Add(-time.Hour), ByModel: byModel})
		if err != nil || len(rows) != 1 {
			t.Fatalf("by model %v: %+v %v", byModel, rows, err)
		}
		r := rows[0]
		for name, c := range map[string]struct {
			got  account.Total
			want *big.Int
		}{
			"actual input": {r.ActualInput, w.ActualInput}, "actual output": {r.ActualOutput, w.ActualOutput},
			"actual cost": {r.ActualCost, w.ActualCost}, "extra charged": {r.ExtraChargedMicro, w.ExtraChargedMicro},
			"refunded": {r.RefundedMicro, new(big.Int)}, "estimated cost": {r.EstimatedCost, big.NewInt(ledgertest.WrapAdmissions)},
		} {
			if c.got.Big().Cmp(c.want) != 0 {
				t.Errorf("by model %v: %s = %s, want %s", byModel, name, c.got, c.want)
			}
		}
		raw, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var back struct {
			Extra json.Number `json:"extra_charged_micro"`
		}
		if err := json.Unmarshal(raw, &back); err != nil || back.Extra.String() != w.ExtraChargedMicro.String() {
			t.Fatalf("JSON %s: extra_charged_micro %q (%v), want the number %s", raw, back.Extra, err, w.ExtraChargedMicro)
		}
	}
}

func TestTotal(t *testing.T) {
	t.Parallel()
	huge, _ := new(big.Int).SetString("-12345678901234567890123", 10)
	var z account.Total
	if z.String() != "0" || z.Tokens() != "0" || z.Sign() != 0 {
		t.Fatalf("zero total: %s %s", z, z.Tokens())
	}
	for _, c := range []struct {
		t           account.Total
		str, tokens string
		json        string
		fits        bool
	}{
		{account.NewTotal(1_500_000), "1500000", "1.5", "1500000", true},
		{account.NewTotal(-1), "-1", "-0.000001", "-1", true},
		{account.NewTotal(math.MaxInt64).AddInt64(1), "9223372036854775808", "9223372036854.775808", "9223372036854775808", false},
		{account.TotalOf(huge), huge.String(), "-12345678901234567.890123", huge.String(), false},
	} {
		raw, _ := json.Marshal(c.t)
		var back account.Total
		if err := json.Unmarshal(raw, &back); err != nil || back.Cmp(c.t) != 0 {
			t.Errorf("%s: round trip through %s: %s %v", c.t, raw, back, err)
		}
		if _, fits := c.t.Int64(); c.t.String() != c.str || c.t.Tokens() != c.tokens || string(raw) != c.json || fits != c.fits {
			t.Errorf("total %s: tokens %s, json %s, fits %v; want %s %s %s %v", c.t, c.t.Tokens(), raw, fits, c.str, c.tokens, c.json, c.fits)
		}
	}
}
