package budget

import (
	"context"
	"time"

	"github.com/tokengate/tokengate/ledger"
)

// SettleParams reports what a request actually used.
type SettleParams struct {
	TenantID     string
	AdmissionID  string
	InputTokens  int64
	OutputTokens int64
	Actor        string
	KeyID        string // as ReserveParams.KeyID; the tenant must not be disabled either
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
	r, err := s.decideOne(ctx, p.TenantID, Op{Settle: &p})
	return r.Settlement, err
}

// ReleaseParams names an admission whose request never ran.
type ReleaseParams struct {
	TenantID    string
	AdmissionID string
	Actor       string
	KeyID       string // as SettleParams.KeyID
}

// Release refunds an admission's whole estimate (capped at capacity): the
// request never ran. Releasing again returns the original answer. It
// returns ErrAdmissionNotFound, or ErrConflict when the admission was
// already settled.
func (s *Store) Release(ctx context.Context, p ReleaseParams) (*Settlement, error) {
	r, err := s.decideOne(ctx, p.TenantID, Op{Release: &p})
	return r.Settlement, err
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
func (t *tenant) expire(w *writes, overdue []*Admission, now time.Time) int {
	n := 0
	for _, a := range overdue {
		if a.ExpiresAt.After(now) || a.State != StateReserved {
			continue // locked by the query but not yet due at the locked clock
		}
		t.Expire()
		e := t.entry(ledger.KindExpire, now, "sweeper")
		e.AdmissionID, e.Model = a.ID, a.Estimate.Model
		e.Estimate = &a.Estimate.Cost
		t.seal(e)
		w.entry(t, e)
		a.State, a.EndedAt = StateExpired, &now
		zero, balance := int64(0), t.Tokens.BalanceMicro
		a.EndDeltaMicro, a.EndBalanceMicro = &zero, &balance
		w.ended = append(w.ended, a)
		n++
	}
	return n
}
