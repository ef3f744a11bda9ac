package account

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	//go:embed sql/drift_report.sql
	driftReportSQL string
	//go:embed sql/drift_report_by_model.sql
	driftReportByModelSQL string
)

// DriftParams selects the admissions a drift report covers: those created
// in [From, To), optionally of one tenant and one model.
type DriftParams struct {
	TenantID string
	Model    string
	From, To time.Time
	// ByModel merges tenants: one row per model, with TenantID "*".
	ByModel bool
}

// DriftRow reconciles estimates with actual usage for one tenant and model.
// Its sums are Totals, exact however large: each admission's figures fit an
// int64, but their sum may not (a history from before usage was bounded).
type DriftRow struct {
	TenantID          string  `json:"tenant_id" db:"tenant_id"`
	Model             string  `json:"model" db:"model"`
	Admissions        int64   `json:"admissions" db:"admissions"`
	EstimatedInput    Total   `json:"estimated_input_tokens" db:"estimated_input_tokens"`
	EstimatedOutput   Total   `json:"estimated_output_tokens" db:"estimated_output_tokens"`
	EstimatedCost     Total   `json:"estimated_cost" db:"estimated_cost"`
	ActualInput       Total   `json:"actual_input_tokens" db:"actual_input_tokens"`
	ActualOutput      Total   `json:"actual_output_tokens" db:"actual_output_tokens"`
	ActualCost        Total   `json:"actual_cost" db:"actual_cost"`
	Settled           int64   `json:"settled" db:"settled"`
	Expired           int64   `json:"expired" db:"expired"`
	MeanRelativeError float64 `json:"mean_relative_error" db:"mean_relative_error"`
	P95AbsRelativeErr float64 `json:"p95_abs_relative_error" db:"p95_abs_relative_error"`
	RefundedMicro     Total   `json:"refunded_micro" db:"refunded_micro"`
	ExtraChargedMicro Total   `json:"extra_charged_micro" db:"extra_charged_micro"`
	// ShadowRefused counts the admissions a shadow limit (of the tenant or
	// an ancestor) would have refused: what enforcing it would have cost.
	ShadowRefused int64 `json:"shadow_refused" db:"shadow_refused"`
	// Money, in micro-units of the deployment's currency, of the
	// admissions whose model had a price when reserved (Priced of them):
	// their estimates, what they actually cost at that price (settled and
	// released ones), and the settled ones' estimate - actual (positive:
	// the estimates reserved more money than was spent).
	Priced              int64 `json:"priced" db:"priced"`
	EstimatedMoneyMicro Total `json:"estimated_money_micro" db:"estimated_money_micro"`
	ActualMoneyMicro    Total `json:"actual_money_micro" db:"actual_money_micro"`
	MoneyDriftMicro     Total `json:"money_drift_micro" db:"money_drift_micro"`
	// Batch: the row reports batch lines (budget/batch's Drift), each
	// counted as an admission, costs in the allowance's units and money at
	// the batch price; false for admissions.
	Batch bool `json:"batch,omitempty" db:"-"`
}

// DriftReport reconciles estimates against actual usage per tenant and
// model. The relative error of a settled admission is (estimate - actual) /
// actual cost (positive: over-estimated); the report gives its mean (the
// bias) and the 95th percentile of its absolute value. Expired counts
// admissions that expired, whether or not a late settle came later.
// Refunded and extra-charged are the effective balance changes at settle
// and release, after the capacity cap.
func (s *Store) DriftReport(ctx context.Context, p DriftParams) ([]DriftRow, error) {
	if p.To.IsZero() {
		p.To = time.Now().Add(time.Hour)
	}
	query := driftReportSQL
	if p.ByModel {
		query = driftReportByModelSQL
	}
	rows, err := s.reads.Query(ctx, query, p.TenantID, p.Model, p.From, p.To)
	if err != nil {
		return nil, fmt.Errorf("budget: drift report: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[DriftRow])
	if err != nil {
		return nil, fmt.Errorf("budget: drift report: %w", err)
	}
	return out, nil
}
