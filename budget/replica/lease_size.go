package replica

import (
	"context"
	"errors"
	"time"

	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
)

// maxBacklog is how many admissions a holder makes before its lease's
// journal is booked whatever its unused part and expiry: a booking writes
// every journal row since the last one under the tenant's row locks (a
// ledger entry per admission and level), so a busy tenant's bookings stay
// short, each holding the locks as long as a few exact batches would.
// It books without renewing (lease.Store.Book): a renew also locks the
// lease's row through its commit, and every journal group of the lease
// updates that row: on a busy tenant (one renew every 256 admissions, 30
// a second against about 500 journal groups) each could hold a group back
// for its commit, and cost a transaction and three reads more than the
// booking (BENCHMARKS.md, "Quota leasing, twelfth step"). The lease is
// renewed when its unused part or its time to live says so.
const maxBacklog = 256

// sliceFor is the slice a holder asks for: what the tenant admitted on
// this replica in half a TTL at its recent rate (rateMicro a second), so
// that a renew every TTL/2 keeps the lease ahead of its admissions; at
// least minMicro (a quiet tenant's first admissions, before a rate is
// known); and at most the tenant's capacity shared by twice the replicas
// holding it (holders), so that the unused slices of every lease together
// hold at most half the capacity (bound 2 of docs/leasing.md), and a
// replica that starts leasing the tenant still finds budget to take. The
// cap wins over the minimum; it is never below one token.
func sliceFor(rateMicro float64, ttl time.Duration, minMicro, capacityMicro int64, holders int) int64 {
	s := max(int64(rateMicro*ttl.Seconds()/2), minMicro)
	if capacityMicro > 0 {
		s = min(s, max(capacityMicro/int64(2*max(holders, 1)), rule.Micro))
	}
	return s
}

// topUp gives back the lease of a tenant idle for a TTL; otherwise it
// sizes the holder's slice from its admissions since the last top-up and
// renews (or takes) its lease when it is below half its slice or within
// TTL/2 of its expiry: well before the holder's own RenewBefore (TTL/3),
// where an admission would wait for the renew.
func (l *Leases) topUp(ctx context.Context, hd *held) error {
	hd.sizing.Lock()
	defer hd.sizing.Unlock()
	now := l.cfg.NowFunc()
	if now.Sub(time.Unix(0, hd.lastUse.Load())) >= l.cfg.TTL {
		if hd.h.State().LeaseID == "" {
			return nil
		}
		hd.snap.Store(nil) // the next admission is exact, and wakes a take
		return hd.h.Return(ctx)
	}
	if now.UnixNano() < hd.exactUntil.Load() {
		return nil
	}
	if dt := now.Sub(hd.sizedAt); !hd.sizedAt.IsZero() && dt > 0 {
		inst := float64(hd.admitted.Swap(0)) / dt.Seconds()
		hd.rate = max(inst, (hd.rate+inst)/2) // up at once, down by halves
		hd.sizedAt = now
	} else if hd.sizedAt.IsZero() {
		hd.admitted.Store(0)
		hd.sizedAt = now
	}
	if hd.snap.Load() == nil {
		// The capacity caps the first slice too.
		if err := l.readTenant(ctx, hd); err != nil {
			return err
		}
	}
	holders := hd.holders
	if hd.h.State().LeaseID == "" {
		holders++ // this replica's lease-to-be
	}
	slice := sliceFor(hd.rate, l.cfg.TTL, l.cfg.MinSlice*rule.Micro, hd.snap.Load().Limits.TokensCapacity*rule.Micro, holders)
	hd.h.SetSlice(slice)
	changed, err := hd.h.TopUp(ctx, slice/2, l.cfg.TTL/2)
	if errors.Is(err, lease.ErrExactOnly) {
		hd.exactUntil.Store(now.Add(l.cfg.TTL).UnixNano())
		return nil
	}
	if err != nil {
		return err
	}
	if changed { // a renew or a take booked the backlog
		hd.backlog.Store(0)
		return l.readTenant(ctx, hd)
	}
	if id := hd.h.State().LeaseID; id != "" && hd.backlog.Load() >= maxBacklog {
		hd.backlog.Store(0)
		if _, err := l.store.Book(ctx, id); err != nil && !errors.Is(err, lease.ErrOver) {
			return err
		}
	}
	return nil
}

// readTenant reads the tenant's snapshot (its limits, and the balance
// outside every lease), how many replicas hold a lease of it, and the
// price book its lease admissions are priced from (the store's copy when
// current: one read of its version), after every take and renew.
func (l *Leases) readTenant(ctx context.Context, hd *held) error {
	snap, err := l.acct.TenantSnapshot(ctx, hd.tenant)
	if err != nil {
		return err
	}
	n, err := l.store.Holders(ctx, hd.tenant)
	if err != nil {
		return err
	}
	book, err := l.acct.PriceBook(ctx)
	if err != nil {
		return err
	}
	hd.prices.Store(book)
	hd.snap.Store(&snap)
	hd.holders = n
	return nil
}
