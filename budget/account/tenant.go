package account

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// CreateTenantParams creates a tenant.
type CreateTenantParams struct {
	ID     string
	Limits rule.Limits
	// Parent nests the tenant's budget in another tenant's ("" for none):
	// every admission must then fit the parent's limits too, and those of
	// its ancestors. It is fixed at creation.
	Parent string
	Actor  string
}

//go:embed sql/tenant_parent.sql
var tenantParentSQL string

// CreateTenant creates a tenant with a full token bucket and writes its
// first ledger entry (kind tenant), whose delta is the starting balance. It
// returns a *LimitError (ErrInvalidLimits) or ErrTenantExists.
func (s *Store) CreateTenant(ctx context.Context, p CreateTenantParams) (rule.Snapshot, error) {
	if err := rule.ValidateTenantID(p.ID); err != nil {
		return rule.Snapshot{}, err
	}
	l := p.Limits
	if err := l.Validate(); err != nil {
		return rule.Snapshot{}, err
	}
	p.Limits = l // with its defaults
	if p.Parent == p.ID {
		return rule.Snapshot{}, &rule.LimitError{Field: "parent", Reason: "a tenant cannot be its own parent"}
	}
	detail, err := json.Marshal(struct {
		Event  string            `json:"event"`
		Parent string            `json:"parent,omitempty"`
		Limits rule.LimitsDetail `json:"limits"`
	}{"created", p.Parent, l.Detail()})
	if err != nil {
		return rule.Snapshot{}, fmt.Errorf("budget: encode limits: %w", err)
	}

	var snap rule.Snapshot
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var now time.Time
		if err := tx.QueryRow(ctx, clockSQL, s.clock()).Scan(&now); err != nil {
			return err
		}
		path := []string{}
		if p.Parent != "" {
			// The parent's path is immutable, so no lock is needed to copy it.
			var endUser bool
			err := tx.QueryRow(ctx, tenantParentSQL, p.Parent).Scan(&path, &endUser)
			if errors.Is(err, pgx.ErrNoRows) {
				return &rule.LimitError{Field: "parent", Reason: fmt.Sprintf("no tenant has the id %q", p.Parent)}
			}
			if err != nil {
				return err
			}
			if endUser {
				return &rule.LimitError{Field: "parent", Reason: fmt.Sprintf("%s is an end user, a leaf: it cannot have tenants below it", p.Parent)}
			}
			path = append(path, p.Parent)
			if len(path) >= rule.MaxDepth {
				return &rule.LimitError{Field: "parent", Reason: fmt.Sprintf("budgets nest at most %d levels, and %s is already at level %d", rule.MaxDepth, p.Parent, len(path))}
			}
		}
		t, e, args := newTenant(p, path, now, string(detail), "")
		var seq int64
		err := tx.QueryRow(ctx, tenantInsertSQL, args...).Scan(&seq)
		if errors.Is(err, pgx.ErrNoRows) {
			return rule.ErrTenantExists
		}
		if err != nil {
			return err
		}
		w := &writes{}
		w.entry(t, e)
		b, _ := w.batch()
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		snap = t.snapshot(now)
		return nil
	})
	if err != nil {
		var le *rule.LimitError
		if errors.Is(err, rule.ErrTenantExists) || errors.As(err, &le) {
			return rule.Snapshot{}, err
		}
		return rule.Snapshot{}, fmt.Errorf("budget: create tenant %s: %w", p.ID, err)
	}
	return snap, nil
}

// newTenant is a new tenant of p below path, created at now with a full
// token bucket: its state, its first ledger entry (kind tenant, with
// detail), and the arguments of tenantInsertSQL (endUserID "" for a tenant
// that is no end user; its end_user_of is then p.Parent). CreateTenant and
// EndUserEnsure both create tenants through it.
func newTenant(p CreateTenantParams, path []string, now time.Time, detail, endUserID string) (*tenant, *ledger.Entry, []any) {
	l := p.Limits
	t := &tenant{id: p.ID, path: path, TenantState: rule.TenantState{Limits: l}}
	t.Tokens = rule.Bucket{CapacityMicro: l.TokensCapacity * rule.Micro, RateMicro: l.TokensRateMicro, At: now}
	var reqMicro *int64
	var reqAt *time.Time
	if l.RequestsCapacity > 0 {
		t.Requests = rule.Bucket{CapacityMicro: l.RequestsCapacity * rule.Micro, RateMicro: l.RequestsRateMicro,
			BalanceMicro: l.RequestsCapacity * rule.Micro, At: now}
		reqMicro, reqAt = &t.Requests.BalanceMicro, &now
	}
	t.advance(now)
	// The starting balance is the first entry's delta, so that the
	// ledger alone sums to every later balance.
	t.Tokens.BalanceMicro = t.Tokens.CapacityMicro
	e := t.entry(ledger.KindTenant, now, actorOr(p.Actor, "cli"))
	e.DeltaMicro = t.Tokens.CapacityMicro
	e.Reason = "created"
	e.Detail = detail
	t.seal(e)
	endUserOf := ""
	if endUserID != "" {
		endUserOf = p.Parent
		t.endUserOf = p.Parent
	}
	return t, e, []any{p.ID, l.TokensCapacity, l.TokensRateMicro, l.RequestsCapacity,
		l.RequestsRateMicro, l.MaxConcurrent, rule.EncodeWindows(l.Windows), l.ReservationTTL.Milliseconds(),
		l.MaxWait.Milliseconds(), t.Tokens.BalanceMicro, now, reqMicro, reqAt, string(l.OnStoreUnavailable),
		l.Shadow.Strings(), p.Parent, path, endUserOf, endUserID}
}

// TenantSnapshot returns a tenant's limits and balances as of the database's
// clock now, refilled, without taking the lock or writing anything. It
// returns ErrTenantNotFound.
func (s *Store) TenantSnapshot(ctx context.Context, tenantID string) (rule.Snapshot, error) {
	b := &pgx.Batch{}
	b.Queue(tenantGetSQL, tenantID)
	b.Queue(clockSQL, s.clock())
	var snap rule.Snapshot
	err := retry(ctx, func() error {
		br := s.pool.SendBatch(ctx, b)
		defer br.Close()
		t, err := scanTenant(br.Query())
		if err != nil {
			return classify(err, false, false)
		}
		var now time.Time
		if err := br.QueryRow().Scan(&now); err != nil {
			return classify(fmt.Errorf("budget: clock: %w", err), false, false)
		}
		t.advance(now)
		snap = t.snapshot(now)
		return nil
	})
	return snap, err
}

// AdmissionGet returns one of a tenant's admissions. It returns
// ErrAdmissionNotFound, also when the id belongs to another tenant.
func (s *Store) AdmissionGet(ctx context.Context, tenantID, admissionID string) (*Admission, error) {
	var a *Admission
	err := retry(ctx, func() error {
		var err error
		a, err = scanAdmission(s.pool.Query(ctx, admissionGetSQL, admissionID, tenantID))
		return classify(err, false, false)
	})
	return a, err
}

// AdmissionRecent returns a tenant's latest admissions, newest first (the
// dashboard's estimate-versus-actual chart).
func (s *Store) AdmissionRecent(ctx context.Context, tenantID string, limit int) ([]*Admission, error) {
	out, err := scanAdmissions(s.pool.Query(ctx, admissionRecentSQL, tenantID, limit))
	if err != nil {
		return nil, fmt.Errorf("budget: recent admissions: %w", err)
	}
	return out, nil
}
