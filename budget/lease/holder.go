package lease

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

// HolderConfig configures a Holder.
type HolderConfig struct {
	TenantID string
	// SliceMicro is the slice a take or a renew asks for.
	SliceMicro int64
	// RenewBefore is how long before its expiry the holder renews its
	// lease (a third of the TTL when zero); past it the holder admits
	// nothing more from the lease until a renew succeeds.
	RenewBefore time.Duration
	// NowFunc is the holder's clock for its lease's expiry (time.Now when
	// nil). The holder never compares it with the store's expires_at: it
	// counts the TTL from its own reading taken before the take or renew
	// (which the store's expiry can only follow), so a clock off the
	// store's by any fixed skew neither stops it admitting (ahead) nor lets
	// it think a lease live past the store's expiry (behind); the journal
	// still refuses, by the store's clock, any admission after expiry.
	NowFunc func() time.Time
}

// Holder admits one tenant's requests in memory from one lease, on one
// replica. An admission is taken from the lease's unused amount under a
// mutex, then journaled (group commit) before it is answered. When the
// lease cannot pay for an admission, the holder renews it (adding a slice)
// or takes a new one, under the same mutex, so a refusal means that this
// replica's lease and every level's balance together were short of it.
type Holder struct {
	s       *Store
	j       *Journal
	c       HolderConfig
	mu      sync.Mutex
	lease   *Lease
	unused  int64     // in memory: what the lease can still pay for
	expires time.Time // by the holder's clock (localExpiry)
	over    bool      // the journal said the lease is over
}

// NewHolder returns a holder of c.TenantID's lease on s, journaling to j.
func NewHolder(s *Store, j *Journal, c HolderConfig) *Holder {
	if c.RenewBefore <= 0 {
		c.RenewBefore = s.ttl / 3
	}
	if c.NowFunc == nil {
		c.NowFunc = time.Now
	}
	return &Holder{s: s, j: j, c: c}
}

// Admit makes a from the lease and returns once it is durable. A *ReplayError
// (ErrReplayed) or rule.ErrIdempotencyMismatch: a's Idempotency-Key already
// names an admission, which is the answer; ErrDuplicate: a's id is
// journaled already. It returns
// ErrExhausted when the lease and the balances cannot pay for it (the
// tenant's budget, less what other replicas' leases hold), ErrExactOnly
// when the tenant cannot be leased, or a store error.
func (h *Holder) Admit(ctx context.Context, a Admission) error {
	for attempt := 0; ; attempt++ {
		leaseID, err := h.take(ctx, a.CostMicro)
		if err != nil {
			return err
		}
		err = h.j.Append(ctx, leaseID, a)
		if refusedByKey(err) || errors.Is(err, ErrReplayed) || errors.Is(err, ErrDuplicate) || errors.Is(err, rule.ErrIdempotencyMismatch) {
			// Not journaled, and nothing taken from the lease (a key's
			// refusal: the store cut the lease's use back by its cost):
			// what was set aside is the lease's again.
			h.mu.Lock()
			if h.lease != nil && h.lease.ID == leaseID && !h.over {
				h.unused += a.CostMicro
			}
			h.mu.Unlock()
			return err
		}
		if !errors.Is(err, ErrOver) {
			return err
		}
		// The store says the lease is over (its expiry by the store's
		// clock, ahead of the holder's; or a sweeper): the amount set
		// aside is not given back in memory. The next take returns the
		// lease and takes a new one; this admission tries once more.
		h.mu.Lock()
		if h.lease != nil && h.lease.ID == leaseID {
			h.over = true
		}
		h.mu.Unlock()
		if attempt == 1 {
			return ErrExhausted
		}
	}
}

// take sets aside cost from the lease in memory, renewing or taking one
// when it cannot pay, and returns the lease's id.
func (h *Holder) take(ctx context.Context, cost int64) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.c.NowFunc()
	stale := h.lease != nil && !now.Before(h.expires.Add(-h.c.RenewBefore))
	if h.lease == nil || stale || h.over || h.unused < cost {
		if err := h.refresh(ctx, max(h.c.SliceMicro, cost)); err != nil {
			return "", err
		}
	}
	if h.lease == nil || h.unused < cost {
		return "", ErrExhausted
	}
	h.unused -= cost
	return h.lease.ID, nil
}

// refresh renews the lease with want more, or, when it is over or there
// is none, takes a new one (returning the old one first).
func (h *Holder) refresh(ctx context.Context, want int64) error {
	if h.lease != nil {
		if !h.over {
			began := h.c.NowFunc()
			l, err := h.s.Renew(ctx, h.lease.ID, want)
			if err == nil {
				h.unused += l.SliceMicro - h.lease.SliceMicro
				h.lease, h.expires = &l, h.localExpiry(began)
				return nil
			}
			if !errors.Is(err, ErrOver) {
				return err
			}
		}
		// Over: give back what it did not use now rather than at the
		// sweep (a no-op when a sweeper or a return ended it already).
		if _, err := h.s.Return(ctx, h.lease.ID); err != nil && !errors.Is(err, ErrOver) {
			return err
		}
		h.lease, h.unused, h.over = nil, 0, false
	}
	began := h.c.NowFunc()
	l, err := h.s.Take(ctx, TakeParams{TenantID: h.c.TenantID, WantMicro: want, MinMicro: 1})
	if errors.Is(err, ErrShort) {
		return nil
	}
	if err != nil {
		return err
	}
	h.lease, h.unused, h.expires = &l, l.SliceMicro, h.localExpiry(began)
	return nil
}

// localExpiry is a lease's expiry by the holder's clock: a TTL after
// began, the holder's reading before the take or renew that set the
// store's expires_at (the store's now, at least as late, plus the TTL).
// The store's absolute expires_at is never compared with the holder's
// clock, which may be off it by any skew.
func (h *Holder) localExpiry(began time.Time) time.Time { return began.Add(h.s.ttl) }

// Return gives the lease back (its journal reconciled, its unused amount
// refunded) and forgets it.
func (h *Holder) Return(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lease == nil {
		return nil
	}
	_, err := h.s.Return(ctx, h.lease.ID)
	h.lease, h.unused, h.over = nil, 0, false
	if errors.Is(err, ErrOver) {
		return nil
	}
	return err
}

// LeaseID is the id of the lease held ("" for none).
func (h *Holder) LeaseID() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lease == nil {
		return ""
	}
	return h.lease.ID
}
