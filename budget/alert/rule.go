package alert

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	//go:embed sql/rule_insert.sql
	ruleInsertSQL string
	//go:embed sql/rule_list.sql
	ruleListSQL string
	//go:embed sql/rule_delete.sql
	ruleDeleteSQL string
)

// Kinds of rule, and the event type each raises.
const (
	KindPeriodBudget = "period_budget"
	KindThrottled    = "throttled"
	KindInvariant    = "invariant"

	TypeThresholdCrossed  = "budget.threshold_crossed"
	TypeThrottled         = "tenant.throttled"
	TypeInvariantViolated = "ledger.invariant_violated"
)

// throttleLimits are the limits a throttled rule may name (the names of
// rule.Limit and the model and pool limits).
var throttleLimits = []string{"tokens", "requests", "concurrency", "period_budget", "input_tokens", "output_tokens", "pool"}

// Rule raises events of one kind for a tenant (every tenant when TenantID
// is nil) and sends them to an endpoint.
type Rule struct {
	ID         int64   `json:"id"`
	TenantID   *string `json:"tenant,omitempty"`
	EndpointID string  `json:"endpoint"`
	Kind       string  `json:"kind"`
	// Thresholds are percentages of the period budget (period_budget).
	Thresholds []int32 `json:"thresholds,omitempty"`
	// Limit (nil: any) must have refused in each of the last
	// SustainMinutes minutes (throttled).
	Limit          *string   `json:"limit,omitempty"`
	SustainMinutes *int32    `json:"sustain_minutes,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
}

// RuleParams is a rule to create.
type RuleParams struct {
	TenantID       string // "" for every tenant
	EndpointID     string
	Kind           string
	Thresholds     []int32
	Limit          string // "" for any
	SustainMinutes int32
}

func (p *RuleParams) check() error {
	if err := storable("tenant", p.TenantID); err != nil {
		return err
	}
	if err := storable("endpoint", p.EndpointID); err != nil {
		return err
	}
	if p.EndpointID == "" {
		return invalid("endpoint", "is required")
	}
	switch p.Kind {
	case KindPeriodBudget:
		if len(p.Thresholds) == 0 || len(p.Thresholds) > 10 {
			return invalid("thresholds", "must list 1 to 10 percentages of the period budget")
		}
		for _, t := range p.Thresholds {
			if t < 1 || t > 1000 {
				return invalid("thresholds", "each must be a percentage from 1 to 1000")
			}
		}
		p.Thresholds = slices.Compact(slices.Sorted(slices.Values(p.Thresholds)))
		if p.Limit != "" || p.SustainMinutes != 0 {
			return invalid("kind", "period_budget takes thresholds, not limit or sustain_minutes")
		}
	case KindThrottled:
		if p.SustainMinutes < 1 || p.SustainMinutes > 1440 {
			return invalid("sustain_minutes", "must be from 1 to 1440")
		}
		if p.Limit != "" && !slices.Contains(throttleLimits, p.Limit) {
			return invalid("limit", fmt.Sprintf("must be one of %v, or empty for any", throttleLimits))
		}
		if len(p.Thresholds) > 0 {
			return invalid("thresholds", "only period_budget rules take thresholds")
		}
	case KindInvariant:
		if len(p.Thresholds) > 0 || p.Limit != "" || p.SustainMinutes != 0 {
			return invalid("kind", "invariant rules take no thresholds, limit or sustain_minutes")
		}
	case "":
		return invalid("kind", "is required")
	default:
		return invalid("kind", "must be period_budget, throttled or invariant")
	}
	return nil
}

func nullable[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// CreateRule adds a rule. It applies from the next decision on.
func (s *Store) CreateRule(ctx context.Context, p RuleParams) (Rule, error) {
	if err := p.check(); err != nil {
		return Rule{}, err
	}
	thresholds := p.Thresholds
	if thresholds == nil {
		thresholds = []int32{}
	}
	rows, _ := s.pool.Query(ctx, ruleInsertSQL, nullable(p.TenantID), p.EndpointID, p.Kind, thresholds,
		nullable(p.Limit), nullable(p.SustainMinutes))
	r, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Rule])
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Rule{}, invalid("endpoint", "no such endpoint, or it is disabled")
	case isFK(err):
		return Rule{}, invalid("tenant", "no such tenant")
	case err != nil:
		return Rule{}, fmt.Errorf("alert: create rule: %w", err)
	}
	return r, nil
}

// Rules lists the rules that apply to a tenant (its own and those for
// every tenant), or every rule when tenantID is "".
func (s *Store) Rules(ctx context.Context, tenantID string) ([]Rule, error) {
	if err := storable("tenant", tenantID); err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, ruleListSQL, nullable(tenantID))
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Rule])
	if err != nil {
		return nil, fmt.Errorf("alert: rules: %w", err)
	}
	return out, nil
}

// DeleteRule stops a rule; its events and their log stay.
func (s *Store) DeleteRule(ctx context.Context, id int64) error {
	tag, err := s.pool.Exec(ctx, ruleDeleteSQL, id)
	if err != nil {
		return fmt.Errorf("alert: delete rule %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}
