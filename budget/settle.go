package budget

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

// SettleParams reports what a request actually used.
type SettleParams struct {
	TenantID     string
	AdmissionID  string
	InputTokens  int64
	OutputTokens int64
	Actor        string
}

// Settlement is the reconciliation of one admission.
type Settlement struct {
	Admission *Admission
	// DeltaMicro is the effective change of the balance: positive for a
	// refund (after the capacity cap), negative for an extra charge.
	DeltaMicro   int64
	BalanceMicro int64
	Snapshot     Snapshot
	// Replayed is true when the admission had already ended this way and
	// the original answer is returned.
	Replayed bool
}

// Settle reconciles an admission with its actual usage: it refunds
// estimate - actual (capped at capacity) or charges the excess, frees the
// concurrency slot and appends a settle entry. Settling again with the same
// usage returns the original answer. A settle of an expired admission still
// reconciles (late). It returns ErrAdmissionNotFound (also for another
// tenant's admission), or ErrConflict when the admission was released or
// settled with different usage.
func (s *Store) Settle(ctx context.Context, p SettleParams) (*Settlement, error) {
	return s.end(ctx, p.TenantID, p.AdmissionID, p.Actor, func(a *Admission) (State, int64, int64, bool) {
		return StateSettled, p.InputTokens, p.OutputTokens, true
	})
}

// ReleaseParams names an admission whose request never ran.
type ReleaseParams struct {
	TenantID    string
	AdmissionID string
	Actor       string
}

// Release refunds an admission's whole estimate (capped at capacity): the
// request never ran. Releasing again returns the original answer. It
// returns ErrAdmissionNotFound, or ErrConflict when the admission was
// already settled.
func (s *Store) Release(ctx context.Context, p ReleaseParams) (*Settlement, error) {
	return s.end(ctx, p.TenantID, p.AdmissionID, p.Actor, func(a *Admission) (State, int64, int64, bool) {
		return StateReleased, 0, 0, false
	})
}

// end is settle and release: one transaction holding the tenant row, then
// the admission row.
func (s *Store) end(ctx context.Context, tenantID, admissionID, actor string, how func(*Admission) (state State, in, out int64, usage bool)) (*Settlement, error) {
	var st *Settlement
	err := retry(ctx, func() error {
		var err error
		st, err = s.endOnce(ctx, tenantID, admissionID, actor, how)
		return err
	})
	return st, err
}

func (s *Store) endOnce(ctx context.Context, tenantID, admissionID, actor string, how func(*Admission) (state State, in, out int64, usage bool)) (*Settlement, error) {
	var a *Admission
	tx, t, now, err := s.lockTenant(ctx, tenantID,
		func(b *pgx.Batch) { b.Queue(admissionLockSQL, admissionID, tenantID) },
		func(br pgx.BatchResults) error {
			var err error
			a, err = scanAdmission(br.QueryRow())
			return err
		})
	if err != nil {
		return nil, err
	}
	target, in, out, usage := how(a)

	switch a.State {
	case StateSettled, StateReleased:
		tx.abort()
		same := a.State == target
		if same && usage {
			same = a.ActualInput != nil && *a.ActualInput == in && a.ActualOutput != nil && *a.ActualOutput == out
		}
		if !same {
			return nil, ErrConflict
		}
		t.advance(now)
		return &Settlement{Admission: a, DeltaMicro: deref(a.EndDeltaMicro), BalanceMicro: deref(a.EndBalanceMicro),
			Snapshot: t.snapshot(now), Replayed: true}, nil
	}

	t.advance(now)
	late := a.State == StateExpired
	actual := int64(0)
	if usage {
		actual = estimator.Cost(in, out, a.Estimate.InputWeightMicro, a.Estimate.OutputWeightMicro)
	}
	cost := a.Estimate.Cost
	applied := t.tokens.Refund((cost - actual) * Micro)
	if !late {
		t.open--
	}
	// The period window: an extra charge always counts against the current
	// window; a refund only returns what was taken from it, so a
	// reservation from a previous window refunds nothing here.
	if diff := actual - cost; t.limits.Period == PeriodNone {
		// no period budget: nothing to count
	} else if diff > 0 {
		t.periodUsed += diff
	} else if t.periodStart != nil && !a.CreatedAt.Before(*t.periodStart) {
		t.periodUsed = max(0, t.periodUsed+diff)
	}

	kind := ledger.KindSettle
	if target == StateReleased {
		kind = ledger.KindRelease
	}
	e := t.entry(kind, now, actorOr(actor, "api"))
	e.AdmissionID, e.Model, e.Late = a.ID, a.Estimate.Model, late
	e.Estimate = &cost
	e.Actual = &actual
	e.DeltaMicro = applied
	t.seal(e)

	a.State, a.Late = target, late
	a.EndedAt = &now
	if usage {
		a.ActualInput, a.ActualOutput = &in, &out
	}
	a.ActualCost = &actual
	balance := t.tokens.BalanceMicro
	a.EndDeltaMicro, a.EndBalanceMicro = &applied, &balance

	b := &pgx.Batch{}
	t.queueUpdate(b)
	ledger.QueueInsert(b, e)
	queueAdmissionEnd(b, a)
	if err := tx.finish(ctx, b); err != nil {
		return nil, err
	}
	return &Settlement{Admission: a, DeltaMicro: applied, BalanceMicro: balance, Snapshot: t.snapshot(now)}, nil
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// expireLocked expires the tenant's overdue reservations that lockTenant's
// extra read returned. Each stays charged at its estimate (delta 0), frees
// its concurrency slot and gets an expire entry.
func (t *tenant) expire(b *pgx.Batch, overdue []*Admission, now time.Time) int {
	n := 0
	for _, a := range overdue {
		if a.ExpiresAt.After(now) || a.State != StateReserved {
			continue // locked by the query but not yet due at the locked clock
		}
		t.open = max(0, t.open-1)
		e := t.entry(ledger.KindExpire, now, "sweeper")
		e.AdmissionID, e.Model = a.ID, a.Estimate.Model
		e.Estimate = &a.Estimate.Cost
		t.seal(e)
		ledger.QueueInsert(b, e)
		a.State, a.EndedAt = StateExpired, &now
		zero, balance := int64(0), t.tokens.BalanceMicro
		a.EndDeltaMicro, a.EndBalanceMicro = &zero, &balance
		queueAdmissionEnd(b, a)
		n++
	}
	return n
}
