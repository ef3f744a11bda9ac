package account

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// State is where an admission is in its life.
type State string

// The states of an admission.
const (
	StateReserved State = "reserved"
	StateSettled  State = "settled"
	StateReleased State = "released"
	StateExpired  State = "expired"
)

// Admission is one reserved estimate and its reconciliation.
type Admission struct {
	ID       string
	TenantID string
	State    State
	// Estimate is what was reserved, with the weights that settle applies
	// to the actual usage (later model-table edits do not change it).
	Estimate        estimator.Estimate
	CreatedAt       time.Time
	ExpiresAt       time.Time
	EndedAt         *time.Time
	Late            bool
	ActualInput     *int64
	ActualOutput    *int64
	ActualCost      *int64
	EndDeltaMicro   *int64 // effective change of the balance at settle or release
	EndBalanceMicro *int64 // balance right after it
	// Shadowed are the shadow limits that would have refused it, as
	// "tenant:limit": its debit left them out, so its end does too.
	Shadowed []string
	// Family is the key of the model limits it was decided with, and
	// ModelLevels the levels whose model buckets it debited: its end
	// corrects exactly those.
	Family      string
	ModelLevels []string
	// PoolID is the upstream pool it drew on ("" for none).
	PoolID string
	// PriceModel and PriceFrom name the price it was reserved at (the
	// model_prices row), MoneyEstimate the money of its estimate and
	// MoneyActual of its usage at that price: all nil when its model had
	// no price.
	PriceModel string
	PriceFrom  *time.Time
	// PriceTier is the service tier of that row ("" for admissions made
	// before tiers: the default tier's).
	PriceTier     string
	MoneyEstimate *int64
	MoneyActual   *int64
	// Face is the face that made it, the only one that may end it.
	Face rule.Face
	// DebitedMicro is what its reserve took from its tenant's token
	// balance, when that was less than its estimate: a local admission
	// replayed at the debt floor, whose debit stopped there (nil: the whole
	// estimate). Its end refunds at most that (TenantState.EndDebited).
	DebitedMicro *int64
}

// admissionRow is a row of admissions, as every query of it reads it
// (admission_*.sql name its columns: a column a later release adds is not
// read, so this release survives that migration), scanned by column name.
type admissionRow struct {
	ID                string     `db:"id"`
	TenantID          string     `db:"tenant_id"`
	State             string     `db:"state"`
	Model             string     `db:"model"`
	InputTokens       int64      `db:"input_tokens"`
	OutputTokens      int64      `db:"output_tokens"`
	Cost              int64      `db:"cost"`
	Approximate       bool       `db:"approximate"`
	InputWeightMicro  int64      `db:"input_weight_micro"`
	OutputWeightMicro int64      `db:"output_weight_micro"`
	CreatedAt         time.Time  `db:"created_at"`
	ExpiresAt         time.Time  `db:"expires_at"`
	EndedAt           *time.Time `db:"ended_at"`
	Late              bool       `db:"late"`
	ActualInput       *int64     `db:"actual_input"`
	ActualOutput      *int64     `db:"actual_output"`
	ActualCost        *int64     `db:"actual_cost"`
	EndDeltaMicro     *int64     `db:"end_delta_micro"`
	EndBalanceMicro   *int64     `db:"end_balance_micro"`
	Shadowed          []string   `db:"shadowed"`
	Family            *string    `db:"family"`
	ModelLevels       []string   `db:"model_levels"`
	PoolID            *string    `db:"pool_id"`
	PriceModel        *string    `db:"price_model"`
	PriceFrom         *time.Time `db:"price_from"`
	PriceTier         *string    `db:"price_tier"`
	MoneyEstimate     *int64     `db:"money_estimate"`
	MoneyActual       *int64     `db:"money_actual"`
	Face              string     `db:"face"`
	DebitedMicro      *int64     `db:"debited_micro"`
}

func (r *admissionRow) admission() *Admission {
	return &Admission{ID: r.ID, TenantID: r.TenantID, State: State(r.State),
		Estimate: estimator.Estimate{Model: r.Model, InputTokens: r.InputTokens, OutputTokens: r.OutputTokens, Cost: r.Cost,
			Approximate: r.Approximate, InputWeightMicro: r.InputWeightMicro, OutputWeightMicro: r.OutputWeightMicro},
		CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt, EndedAt: r.EndedAt, Late: r.Late,
		ActualInput: r.ActualInput, ActualOutput: r.ActualOutput, ActualCost: r.ActualCost,
		EndDeltaMicro: r.EndDeltaMicro, EndBalanceMicro: r.EndBalanceMicro, Shadowed: r.Shadowed,
		Family: deref0(r.Family), ModelLevels: r.ModelLevels, PoolID: deref0(r.PoolID),
		PriceModel: deref0(r.PriceModel), PriceFrom: r.PriceFrom, PriceTier: deref0(r.PriceTier), MoneyEstimate: r.MoneyEstimate, MoneyActual: r.MoneyActual,
		Face: rule.Face(r.Face), DebitedMicro: r.DebitedMicro}
}

// scanAdmission reads one admission row. It returns ErrAdmissionNotFound.
func scanAdmission(rows pgx.Rows, err error) (*Admission, error) {
	if err != nil {
		return nil, err
	}
	r, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[admissionRow])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, rule.ErrAdmissionNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("budget: scan admission: %w", err)
	}
	return r.admission(), nil
}

// scanAdmissions reads admission rows.
func scanAdmissions(rows pgx.Rows, err error) ([]*Admission, error) {
	if err != nil {
		return nil, err
	}
	rs, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[admissionRow])
	if err != nil {
		return nil, fmt.Errorf("budget: scan admissions: %w", err)
	}
	out := make([]*Admission, len(rs))
	for i, r := range rs {
		out[i] = r.admission()
	}
	return out, nil
}
