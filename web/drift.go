package web

import (
	"context"
	"strconv"
	"time"

	"github.com/tokengate/tokengate/budget/account"
)

// driftWindow is the span the pages' reconciliation reports cover.
const driftWindow = 24 * time.Hour

// driftView is the reconciliation report of the last day: per model, the
// estimated against the actual cost as paired horizontal bars (SVG geometry
// computed here, so no inline style), and the figures in a table.
type driftView struct {
	Rows          []driftRow
	Width, Height int
	Label, Right  int // where bars start and end in the viewBox
}

type driftRow struct {
	Model                     string
	Admissions, Settled       int64
	EstIn, EstOut, ActIn, Act account.Total // rendered with bignum: exact however large
	MeanErr, P95Err           string
	Expired                   int64
	// ShadowRefused counts the admissions a shadow limit would have
	// refused: what enforcing it would have cost this model's callers.
	ShadowRefused   int64
	Refunded, Extra account.Total // micro-tokens, rendered with bigtokens
	// The money of the priced admissions (micro-units of the currency,
	// rendered with bigtokens as an exact decimal).
	Priced                         int64
	EstMoney, ActMoney, MoneyDrift account.Total
	Y, TextY                       int
	EstW, ActW                     string
	Over                           bool
}

func percent(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" }

// newDrift lays out report rows, one bar pair per model. The sums are
// exact Totals; only the bars' geometry is approximated, in float64.
func newDrift(rows []account.DriftRow) driftView {
	v := driftView{Width: 960, Label: 220, Right: 940}
	top := account.NewTotal(1)
	for _, r := range rows {
		for _, c := range []account.Total{r.EstimatedCost, r.ActualCost} {
			if c.Cmp(top) > 0 {
				top = c
			}
		}
	}
	span := float64(v.Right - v.Label)
	w := func(n account.Total) string {
		return strconv.FormatFloat(max(0, n.Float64())*span/top.Float64(), 'f', 1, 64)
	}
	for i, r := range rows {
		mean := "—"
		p95 := "—"
		if r.Settled > 0 {
			mean, p95 = percent(r.MeanRelativeError), percent(r.P95AbsRelativeErr)
			if r.MeanRelativeError > 0 {
				mean = "+" + mean
			}
		}
		model := r.Model
		if r.Batch {
			model += " (batch)" // its batch lines, beside its admissions
		}
		v.Rows = append(v.Rows, driftRow{
			Model: model, Admissions: r.Admissions, Settled: r.Settled, Expired: r.Expired, ShadowRefused: r.ShadowRefused,
			EstIn: r.EstimatedInput, EstOut: r.EstimatedOutput, ActIn: r.ActualInput, Act: r.ActualOutput,
			MeanErr: mean, P95Err: p95,
			Refunded: r.RefundedMicro, Extra: r.ExtraChargedMicro,
			Priced: r.Priced, EstMoney: r.EstimatedMoneyMicro, ActMoney: r.ActualMoneyMicro, MoneyDrift: r.MoneyDriftMicro,
			Y: 8 + i*36, TextY: 8 + i*36 + 20,
			EstW: w(r.EstimatedCost), ActW: w(r.ActualCost), Over: r.ActualCost.Cmp(r.EstimatedCost) > 0,
		})
	}
	v.Height = 16 + len(rows)*36
	return v
}

// drift reads the last day's reconciliation report: one tenant's models, or
// (tenantID "") every model across tenants.
func (d *Dashboard) drift(ctx context.Context, tenantID string) (driftView, error) {
	rows, err := d.admin.DriftReport(ctx, account.DriftParams{TenantID: tenantID, From: time.Now().Add(-driftWindow), ByModel: tenantID == ""})
	if err != nil {
		return driftView{}, err
	}
	return newDrift(rows), nil
}
