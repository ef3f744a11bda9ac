package lease

import (
	"context"
	"errors"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

// HolderState is what a holder holds, as its replica's background work
// and its admissions' answers read it.
type HolderState struct {
	LeaseID string // "" for none
	// UnusedMicro is what the lease can still pay for, in memory.
	UnusedMicro int64
	SliceMicro  int64 // what a take or a renew asks for now
	// ExpiresAt is the lease's expiry by the holder's clock (a TTL after
	// its reading before the last take or renew), not the store's.
	ExpiresAt time.Time
	// Over: the journal said the lease is over (the next admission or
	// TopUp replaces it).
	Over bool
}

// State returns what the holder holds now.
func (h *Holder) State() HolderState {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := HolderState{UnusedMicro: h.unused, SliceMicro: h.c.SliceMicro, ExpiresAt: h.expires, Over: h.over}
	if h.lease != nil {
		st.LeaseID = h.lease.ID
	}
	return st
}

// SetSlice sets the slice the holder's next take or renew asks for: its
// replica sizes it from the tenant's recent admission rate.
func (h *Holder) SetSlice(micro int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.c.SliceMicro = max(micro, 1)
}

// TopUp brings the holder's lease up to its slice ahead of need, without
// holding the holder's mutex over the store's transaction, so that the
// admissions made meanwhile are not held up: it takes a lease when there
// is none, takes a new one when the old one is over (returning the old
// one), and renews a live one whose unused amount is below low or that
// expires within renewWithin (by the holder's clock), asking for what
// the slice lacks. It reports whether it changed anything. It returns
// ErrExactOnly (an *ExactOnlyError) or a store error; ErrShort (the
// budget left is below one token) is not an error.
//
// A foreground refresh (an admission the lease could not pay for) may
// run at the same time: a renew's answer is applied only when its slice
// is larger than the one the holder knows (a lease's slice only grows),
// and a lease taken while another was installed is returned at once.
func (h *Holder) TopUp(ctx context.Context, low int64, renewWithin time.Duration) (bool, error) {
	h.mu.Lock()
	var cur *Lease
	if h.lease != nil {
		c := *h.lease
		cur = &c
	}
	over, unused, slice := h.over, h.unused, h.c.SliceMicro
	due := cur == nil || over || unused < low || !h.c.NowFunc().Before(h.expires.Add(-renewWithin))
	h.mu.Unlock()
	if !due {
		return false, nil
	}
	if cur != nil && !over {
		began := h.c.NowFunc()
		l, err := h.s.Renew(ctx, cur.ID, max(slice-unused, 0))
		switch {
		case err == nil:
			h.mu.Lock()
			if h.lease != nil && h.lease.ID == l.ID && !h.over {
				if add := l.SliceMicro - h.lease.SliceMicro; add > 0 {
					h.unused += add
					h.lease.SliceMicro = l.SliceMicro
				}
				if exp := h.localExpiry(began); exp.After(h.expires) {
					h.expires, h.lease.ExpiresAt = exp, l.ExpiresAt
				}
			}
			h.mu.Unlock()
			return true, nil
		case !errors.Is(err, ErrOver):
			return false, err
		}
	}
	if cur != nil {
		if _, err := h.s.Return(ctx, cur.ID); err != nil && !errors.Is(err, ErrOver) {
			return false, err
		}
	}
	began := h.c.NowFunc()
	l, err := h.s.Take(ctx, TakeParams{TenantID: h.c.TenantID, WantMicro: slice, MinMicro: 1})
	if errors.Is(err, ErrShort) {
		h.mu.Lock()
		if cur != nil && h.lease != nil && h.lease.ID == cur.ID {
			h.lease, h.unused, h.over = nil, 0, false // returned above
		}
		h.mu.Unlock()
		return cur != nil, nil
	}
	if err != nil {
		return false, err
	}
	h.mu.Lock()
	installed := h.lease == nil || (cur != nil && h.lease.ID == cur.ID)
	if installed {
		h.lease, h.unused, h.expires, h.over = &l, l.SliceMicro, h.localExpiry(began), false
	}
	h.mu.Unlock()
	if !installed {
		// A foreground refresh installed a lease meanwhile: give this
		// one back rather than hold two.
		if _, err := h.s.Return(ctx, l.ID); err != nil && !errors.Is(err, ErrOver) {
			return true, err
		}
	}
	return true, nil
}

// AdmitHeld is Admit without a renew or a take: a from what the lease
// holds in memory, journaled, or ErrExhausted at once when there is no
// lease, it is over, within RenewBefore of its expiry, or short of a's
// cost (the caller decides otherwise, and its replica's TopUp refills the
// lease in the background). ErrOver: the journal said the lease is over
// (marked, for the next TopUp). So an admission never waits for a store
// transaction other than its journal's group commit.
//
// keep, when not nil, is called before journaling with what the lease
// holds unused once a's cost is set aside (read under the mutex that sets
// it aside, so the admissions of the replica in flight are counted as
// they were taken, not as they end), and what it returns is journaled as
// a.Response: the answer a keyed request keeps is the one it is given. An
// error of keep gives the cost back and is returned.
func (h *Holder) AdmitHeld(ctx context.Context, a Admission, keep func(unusedMicro int64) ([]byte, error)) error {
	_, err := h.AdmitHeldIn(ctx, a, keep)
	return err
}

// Held names an admission AdmitHeldIn made: the lease it was journaled
// in, and its id (the journal's, when the admission was Grouped).
type Held struct {
	LeaseID, ID string
}

// AdmitHeldIn is AdmitHeld, and names the lease the admission was
// journaled in and its id (when it was journaled).
func (h *Holder) AdmitHeldIn(ctx context.Context, a Admission, keep func(unusedMicro int64) ([]byte, error)) (Held, error) {
	h.mu.Lock()
	if h.lease == nil || h.over || h.unused < a.CostMicro || !h.c.NowFunc().Before(h.expires.Add(-h.c.RenewBefore)) {
		h.mu.Unlock()
		return Held{}, ErrExhausted
	}
	h.unused -= a.CostMicro
	leaseID, unused := h.lease.ID, h.unused
	h.mu.Unlock()
	if keep != nil {
		resp, err := keep(unused)
		if err != nil {
			h.giveBack(leaseID, a.CostMicro)
			return Held{}, err
		}
		a.Response = resp
	}
	id, err := h.j.AppendID(ctx, leaseID, a)
	// A key's refusal, a replay or a duplicate id took nothing from the
	// lease in the store: what was set aside is the lease's again.
	keyRefused := refusedByKey(err) || errors.Is(err, ErrReplayed) || errors.Is(err, rule.ErrIdempotencyMismatch) || errors.Is(err, ErrDuplicate)
	if keyRefused || errors.Is(err, ErrOver) {
		h.mu.Lock()
		if h.lease != nil && h.lease.ID == leaseID {
			if keyRefused {
				h.unused += a.CostMicro // the store cut the lease's use back by it
			} else {
				h.over = true
			}
		}
		h.mu.Unlock()
	}
	return Held{LeaseID: leaseID, ID: id}, err
}

// EndHeld ends an admission of leaseID in the journal (Journal.End) and,
// once it is ended, gives its refund back to the lease in memory, so the
// holder admits it again.
func (h *Holder) EndHeld(ctx context.Context, leaseID string, e End) error {
	if err := h.j.End(ctx, leaseID, e); err != nil {
		return err
	}
	h.giveBack(leaseID, e.RefundMicro)
	return nil
}

// giveBack returns cost, set aside from leaseID and not journaled, to the
// lease in memory (if it is still the holder's).
func (h *Holder) giveBack(leaseID string, cost int64) {
	h.mu.Lock()
	if h.lease != nil && h.lease.ID == leaseID && !h.over {
		h.unused += cost
	}
	h.mu.Unlock()
}
