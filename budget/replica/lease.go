package replica

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// DefaultLeaseMinSlice is the smallest slice a holder asks for, in tokens,
// unless configured: a tenant's first lease on a replica, before its rate
// is known, and a quiet tenant's.
const DefaultLeaseMinSlice = 1000

// LeaseConfig configures quota leasing on a replica (docs/leasing.md).
// Zero fields take defaults.
type LeaseConfig struct {
	// Holder names this replica in the leases it takes.
	Holder string
	// TTL is a lease's life from its take or last renew
	// (lease.DefaultTTL): the longest a dead replica holds budget.
	TTL time.Duration
	// MinSlice is the smallest slice a holder asks for, in tokens
	// (DefaultLeaseMinSlice).
	MinSlice int64
	// OpenMax is how many of its open leased admissions the replica
	// remembers to settle in their lease's journal (DefaultLeaseOpenMax);
	// the settle of one it forgot, or never knew, is exact. Negative:
	// none (every settle exact).
	OpenMax int
	// Tick is how often the background sizes the holders' slices and
	// renews them ahead of need (TTL/10); an admission that leaves its
	// lease low wakes it at once. Negative: no background loop (tests
	// call TopUpOnce).
	Tick time.Duration
	// NowFunc is the holders' clock (time.Now); ClockFunc freezes the
	// store's statements (tests: the account store's frozen clock).
	NowFunc, ClockFunc func() time.Time
	// JournalGroups makes the journal write the compact journal's groups
	// shape (lease.Config.JournalGroups; serve --lease-journal groups).
	JournalGroups bool
}

// Leases is a replica's quota leasing: the lease store (and its mode
// cache), the journal, and one holder per tenant it admits in mode auto,
// built on first use. Run commits the journal, sweeps expired leases every
// TTL/2, and sizes and renews the holders in the background, so that an
// admission in the steady state never waits for a take or a renew: until
// a tenant's first lease is taken, its requests are decided exactly.
type Leases struct {
	store   *lease.Store
	journal *lease.Journal
	acct    *account.Store
	cfg     LeaseConfig
	logger  *slog.Logger
	kick    chan struct{}
	holders sync.Map  // tenant id -> *held: read on every lease admission
	open    openIndex // its leased admissions, for their settles (lease_end.go, open_index.go)
}

// held is one tenant's holder and what sizes it.
type held struct {
	tenant   string
	h        *lease.Holder
	admitted atomic.Int64 // micro-tokens admitted since the last sizing
	// backlog counts the admissions since the last booking (a renew's, a
	// take's, or the top-up's at maxBacklog): each is a journal row the
	// next one books under the tenant's row locks.
	backlog atomic.Int64
	lastUse atomic.Int64 // unix nanoseconds of the last admission, by NowFunc
	// exactUntil: the take said exact only; no lease until then.
	exactUntil atomic.Int64
	// snap is the tenant's snapshot read after the last take or renew:
	// its limits, and the balance outside every lease then.
	snap atomic.Pointer[rule.Snapshot]
	// prices is the price book read with snap: a lease admission is
	// priced from it, with no read per admission.
	prices atomic.Pointer[estimator.PriceBook]

	sizing  sync.Mutex // the fields below, for one top-up at a time
	sizedAt time.Time
	rate    float64 // micro-tokens a second, smoothed
	holders int     // live leases of the tenant at the last read
}

var errNoLease = errors.New("replica: no lease of the tenant held yet")

func newLeases(acct *account.Store, c LeaseConfig, logger *slog.Logger) (*Leases, error) {
	if c.TTL <= 0 {
		c.TTL = lease.DefaultTTL
	}
	if c.MinSlice <= 0 {
		c.MinSlice = DefaultLeaseMinSlice
	}
	if c.Tick == 0 {
		c.Tick = c.TTL / 10
	}
	if c.OpenMax == 0 {
		c.OpenMax = DefaultLeaseOpenMax
	}
	if c.NowFunc == nil {
		c.NowFunc = time.Now
	}
	// Half the capacity at most, unused in the leases of every replica
	// together (bound 2): sliceFor shares it out, the store enforces it.
	s, err := lease.New(lease.Config{Store: acct, Holder: c.Holder, TTL: c.TTL, ClockFunc: c.ClockFunc, MaxUnusedPercent: 50,
		JournalGroups: c.JournalGroups})
	if err != nil {
		return nil, err
	}
	return &Leases{store: s, journal: lease.NewJournal(s), acct: acct, cfg: c, logger: logger,
		kick: make(chan struct{}, 1), open: openIndex{max: max(c.OpenMax, 0)}}, nil
}

// Store is the lease store (the admin service sets modes through it, so
// that this replica's copy of the modes sees a change at once).
func (l *Leases) Store() *lease.Store { return l.store }

// Auto implements admission.Leases.
func (l *Leases) Auto(ctx context.Context, tenantID string) bool {
	ok, err := l.store.Auto(ctx, tenantID)
	return err == nil && ok
}

// Pooled implements admission.Leases.
func (l *Leases) Pooled(ctx context.Context, e estimator.Estimate) bool {
	ok, err := l.acct.PoolRouted(ctx, e)
	return err != nil || ok
}

// Admit implements admission.Leases: the tenant's holder admits a from
// what its lease holds in memory (lease.Holder.AdmitHeld), never waiting
// for a take or a renew: a lease that cannot pay sends the request to the
// exact pipeline and wakes the top-up. The answer's snapshot reports, as
// TokensMicro, the lease's unused part plus the balance outside every
// lease at its last take or renew. With keep (a keyed request keeping its
// answer), that figure is read as the holder sets the cost aside (the
// unused part then), so that the answer kept for a retry is the one given.
// a is priced as a reserve is (account.PriceAdmission), from the price
// book read at the lease's last take or renew. It returns the admission's
// id: the journal's when a is Grouped.
func (l *Leases) Admit(ctx context.Context, tenantID string, a lease.Admission, keep func(rule.Snapshot) ([]byte, error)) (string, rule.Snapshot, error) {
	hd := l.holder(tenantID)
	now := l.cfg.NowFunc()
	hd.lastUse.Store(now.UnixNano())
	if now.UnixNano() < hd.exactUntil.Load() {
		return "", rule.Snapshot{}, lease.ErrExactOnly
	}
	snap := hd.snap.Load()
	if snap == nil {
		l.wake()
		return "", rule.Snapshot{}, errNoLease
	}
	var kept *rule.Snapshot
	var keepAt func(int64) ([]byte, error)
	if keep != nil {
		keepAt = func(unused int64) ([]byte, error) {
			out := *snap
			out.TokensMicro += unused
			kept = &out
			return keep(out)
		}
	}
	if err := account.PriceAdmission(hd.prices.Load(), &a.Admission, now); err != nil {
		return "", rule.Snapshot{}, err
	}
	// The row's expiry from the TTL the answer's is computed from
	// (admission.leaseReservation), not read from the tenant per row.
	a.ReservationTTL = snap.Limits.ReservationTTL
	if a.ReservationTTL <= 0 {
		a.ReservationTTL = rule.DefaultReservationTTL
	}
	held, err := hd.h.AdmitHeldIn(ctx, a, keepAt)
	if err != nil {
		if errors.Is(err, lease.ErrExactOnly) {
			hd.exactUntil.Store(now.Add(l.cfg.TTL).UnixNano())
		}
		l.wake()
		return "", rule.Snapshot{}, err
	}
	a.ID = held.ID
	l.open.add(held.LeaseID, &a.Admission, a.Face.StoredKey(a.IdempotencyKey))
	hd.admitted.Add(a.CostMicro)
	st, backlog := hd.h.State(), hd.backlog.Add(1)
	if st.UnusedMicro < st.SliceMicro/2 || backlog == maxBacklog {
		l.wake() // renew ahead of need
	}
	if kept != nil {
		return held.ID, *kept, nil
	}
	out := *snap
	out.TokensMicro += st.UnusedMicro
	return held.ID, out, nil
}

// holder is the tenant's holder, built on first use.
func (l *Leases) holder(tenantID string) *held {
	if v, ok := l.holders.Load(tenantID); ok {
		return v.(*held)
	}
	hd := &held{tenant: tenantID, h: lease.NewHolder(l.store, l.journal, lease.HolderConfig{
		TenantID: tenantID, SliceMicro: l.cfg.MinSlice * rule.Micro, NowFunc: l.cfg.NowFunc})}
	v, _ := l.holders.LoadOrStore(tenantID, hd)
	return v.(*held)
}

func (l *Leases) wake() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Run commits the journal, sweeps expired leases every TTL/2, and sizes
// and renews the holders (every Tick, and when an admission leaves a
// lease low) until ctx ends; it then returns every lease this replica
// holds, so that a replica shut down gives its budget back at once rather
// than at the TTL.
func (l *Leases) Run(ctx context.Context) {
	var wg sync.WaitGroup
	jctx, stopJournal := context.WithCancel(context.WithoutCancel(ctx))
	wg.Add(1)
	go func() { defer wg.Done(); l.journal.Run(jctx) }()
	// The sweeper runs apart from the top-up, whose renews may wait for a
	// busy tenant's row locks for up to TTL/2 each: behind them, a dead
	// replica's lease would be swept later than TTL + TTL/2 (bound 3).
	wg.Add(1)
	go func() { defer wg.Done(); l.sweep(ctx) }()
	var tick <-chan time.Time
	if l.cfg.Tick > 0 {
		t := time.NewTicker(l.cfg.Tick)
		defer t.Stop()
		tick = t.C
	}
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick:
			l.TopUpOnce(ctx)
		case <-l.kick:
			if tick != nil {
				l.TopUpOnce(ctx)
			}
		}
	}
	// Admissions in flight journal before their leases are returned.
	stopJournal()
	wg.Wait()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, hd := range l.all() {
		if err := hd.h.Return(rctx); err != nil {
			l.logger.Warn("lease return at shutdown", "tenant", hd.tenant, "error", err.Error())
		}
	}
}

// sweep expires the leases past their expiry, any replica's, every TTL/2
// until ctx ends.
func (l *Leases) sweep(ctx context.Context) {
	t := time.NewTicker(l.cfg.TTL / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := l.store.Sweep(ctx, 100); err != nil && ctx.Err() == nil {
				l.logger.Warn("lease sweep", "error", err.Error())
			}
		}
	}
}

func (l *Leases) all() []*held {
	var out []*held
	l.holders.Range(func(_, v any) bool { out = append(out, v.(*held)); return true })
	return out
}

// topUps is how many holders a top-up pass renews at once: a pass over
// many tenants one at a time (a booking and a renew each, under each
// tenant's row locks) took longer than the window between a renew being
// due (TTL/2 before the expiry) and the holder refusing (TTL/3), and the
// tenants in between were decided exactly.
const topUps = 4

// TopUpOnce sizes every holder's slice and renews (or takes) its lease
// when it is low or near its expiry, and gives back the lease of a tenant
// idle for a TTL, topUps holders at a time; it returns when all are done.
// Run calls it, tests call it on a frozen clock.
func (l *Leases) TopUpOnce(ctx context.Context) {
	sem := make(chan struct{}, topUps)
	var wg sync.WaitGroup
	for _, hd := range l.all() {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			// A top-up that takes half a TTL is stuck: the next one retries.
			tctx, cancel := context.WithTimeout(ctx, l.cfg.TTL/2)
			err := l.topUp(tctx, hd)
			cancel()
			if err != nil && ctx.Err() == nil {
				l.logger.Warn("lease top-up", "tenant", hd.tenant, "error", err.Error())
			}
		}()
	}
	wg.Wait()
}
