package budget

import (
	"context"

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
	GatewayID    string // as ReserveParams.GatewayID
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
// tenant's admission), ErrConflict when the admission was released or
// settled with different usage, ErrKeyRevoked, ErrGatewayRevoked or
// ErrOutOfScope.
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
	GatewayID   string // as ReserveParams.GatewayID
}

// Release refunds an admission's whole estimate (capped at capacity): the
// request never ran. Releasing again returns the original answer. It
// returns ErrAdmissionNotFound, ErrConflict when the admission was
// already settled, ErrKeyRevoked, ErrGatewayRevoked or ErrOutOfScope.
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

// expire expires the tenant's overdue reservations that the batch locked:
// each stays charged at its estimate (delta 0), frees its concurrency slot
// and gets an expire entry. One this batch already settled or released is
// left alone; one it expires, a later settle in the batch finds expired (and
// reconciles late).
func (d *decision) expire(overdue []*Admission) int {
	t, now := d.t, d.now
	n := 0
	for _, locked := range overdue {
		a := locked
		if ended, ok := d.adms[a.ID]; ok {
			a = ended
		}
		if a.ExpiresAt.After(now) || a.State != StateReserved {
			continue // locked by the query but not yet due at the locked clock, or ended meanwhile
		}
		for _, lv := range d.chain {
			skip := skipOf(a.Shadowed, lv.id)
			lv.ExpireExcept(skip)
			e := lv.entry(ledger.KindExpire, now, "sweeper")
			e.AdmissionID, e.Model = a.ID, a.Estimate.Model
			e.Estimate = &a.Estimate.Cost
			e.Reason = shadowReason(skip)
			lv.seal(e)
			d.w.entry(lv, e)
		}
		expired := *a
		expired.State, expired.EndedAt = StateExpired, &now
		zero, balance := int64(0), t.Tokens.BalanceMicro
		expired.EndDeltaMicro, expired.EndBalanceMicro = &zero, &balance
		d.adms[a.ID] = &expired
		d.w.end(&expired)
		n++
	}
	return n
}
