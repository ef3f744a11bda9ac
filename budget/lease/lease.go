package lease

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/ledger"
)

var (
	//go:embed sql/lease_insert.sql
	leaseInsertSQL string
	//go:embed sql/lease_lock.sql
	leaseLockSQL string
	//go:embed sql/lease_update.sql
	leaseUpdateSQL string
	//go:embed sql/lease_unused.sql
	leaseUnusedSQL string
	//go:embed sql/lease_end.sql
	leaseEndSQL string
	//go:embed sql/lease_expired.sql
	leaseExpiredSQL string
	//go:embed sql/lease_live.sql
	leaseLiveSQL string
	//go:embed sql/lease_tenant.sql
	leaseTenantSQL string
)

// The package's sentinel errors.
var (
	// ErrExactOnly: a level of the tenant's tree has a rule a lease cannot
	// keep (ExactOnlyError says which); the tenant is decided exactly.
	ErrExactOnly = errors.New("lease: the tenant has a rule only exact mode keeps")
	// ErrShort: some level holds less than the smallest slice asked for.
	ErrShort = errors.New("lease: the budget left is short of the smallest slice")
	// ErrOver: the lease is no longer live (returned or expired), or past
	// its expiry: nothing more may be admitted from it.
	ErrOver = errors.New("lease: the lease is over")
	// ErrExhausted: a holder could neither admit from its lease nor get
	// more budget for it.
	ErrExhausted = errors.New("lease: no leased budget for the admission")
)

// ExactOnlyError names the level and the rule that keep a tenant exact.
type ExactOnlyError struct{ TenantID, Rule string }

func (e *ExactOnlyError) Error() string {
	return fmt.Sprintf("lease: tenant %s has %s, which only exact mode keeps", e.TenantID, e.Rule)
}

// Unwrap makes errors.Is(e, ErrExactOnly) true.
func (e *ExactOnlyError) Unwrap() error { return ErrExactOnly }

// DefaultTTL is how long a lease lives without a renew: the longest a dead
// replica holds budget.
const DefaultTTL = 10 * time.Second

// Config configures a Store. Store is required.
type Config struct {
	Store *account.Store
	// Holder names this replica in the leases it takes.
	Holder string
	// TTL is a lease's time to live from its take or last renew
	// (DefaultTTL when zero).
	TTL time.Duration
	// ClockFunc freezes the clock of the journal's and the sweeper's
	// statements (tests); it must be the account store's frozen clock.
	// Nil: the database's.
	ClockFunc func() time.Time
	// MaxUnusedPercent caps what a tenant's live leases together hold
	// unused after any take or renew, in percent of the tenant's token
	// capacity (0: no cap; at most 100). A take or renew debits at most
	// what keeps the sum under the cap, read under the tenant's row lock
	// (lease_unused.sql), so the cap holds at every moment, whatever each
	// holder asked for: bound 2 of docs/leasing.md. A replica sets 50
	// (budget/replica).
	MaxUnusedPercent int64
	// JournalGroups makes the journal write the compact journal's groups
	// shape (docs/leasing.md, "The compact journal"; 00039): a group's
	// admissions as one row of arrays, not one admissions row each. Every
	// admission is given a grouped id (Admission.Grouped is implied), so
	// that a reader finds it by its id.
	JournalGroups bool
}

// Store owns the leases (table leases); their admissions are account's
// rows, written by the journal (journal.go). Every change of a balance goes through the account
// store's LockedLevels, under the tree's row locks, with its ledger
// entries.
type Store struct {
	acct   *account.Store
	holder string
	ttl    time.Duration
	clock  func() time.Time
	modes  modeCache  // mode_cache.go
	pct    int64      // Config.MaxUnusedPercent
	groups bool       // Config.JournalGroups
	hints  groupHints // the groups shape's: each lease's groups since its last Book
}

// New returns a Store, and enables leasing on its account store
// (account.Store.EnableLeasing).
func New(c Config) (*Store, error) {
	if c.Store == nil {
		return nil, errors.New("lease: Config.Store is required")
	}
	if c.MaxUnusedPercent < 0 || c.MaxUnusedPercent > 100 {
		return nil, fmt.Errorf("lease: Config.MaxUnusedPercent %d: a percent of the capacity, 0 (no cap) to 100", c.MaxUnusedPercent)
	}
	s := &Store{acct: c.Store, holder: c.Holder, ttl: c.TTL, clock: c.ClockFunc, pct: c.MaxUnusedPercent, groups: c.JournalGroups}
	if s.ttl <= 0 {
		s.ttl = DefaultTTL
	}
	if s.holder == "" {
		s.holder = "replica"
	}
	// The account store's keyed reserves take the keys' advisory locks
	// for tenants with a live lease, as the journal's groups do.
	c.Store.EnableLeasing()
	return s, nil
}

// frozen is the clock argument of the statements that read the time
// outside a lock: nil means the database's clock.
func (s *Store) frozen() *time.Time {
	if s.clock == nil {
		return nil
	}
	t := s.clock()
	return &t
}

// Lease is a lease as its holder sees it.
type Lease struct {
	ID       string
	TenantID string
	Levels   []string // root first
	// SliceMicro is everything debited for it so far; UsedMicro what its
	// journal holds against it.
	SliceMicro int64
	UsedMicro  int64
	ExpiresAt  time.Time
}

// TakeParams asks for a lease of WantMicro micro-tokens; less is taken if
// some level holds less, down to MinMicro (ErrShort below it).
type TakeParams struct {
	TenantID  string
	WantMicro int64
	MinMicro  int64
}

// Take pre-debits a slice at every level of the tenant's tree in one
// transaction under the tree's row locks, with a lease_take entry at each
// level, and records the lease. The slice is the smallest of WantMicro and
// every level's balance, so no level goes below zero: spending from a
// lease can never pass a budget. It returns *ExactOnlyError (ErrExactOnly:
// a level's rule, or the tenant's lease mode is not auto), ErrShort or
// rule.ErrTenantNotFound.
func (s *Store) Take(ctx context.Context, p TakeParams) (Lease, error) {
	if p.WantMicro <= 0 || p.MinMicro < 0 || p.MinMicro > p.WantMicro {
		return Lease{}, fmt.Errorf("lease: take: want %d, min %d: want must be positive and at least min", p.WantMicro, p.MinMicro)
	}
	l := Lease{ID: newID(), TenantID: p.TenantID}
	_, err := s.acct.LockedLevels(ctx, p.TenantID, func(ctx context.Context, q account.LockedQuerier, now time.Time, levels []account.Level) ([]account.LevelMove, error) {
		// The mode, under the row lock SetMode takes to set it and end the
		// leases: from a mode off's commit on, no replica takes a lease of
		// the tenant, whatever its copy of the modes still says.
		var mode Mode
		if err := q.QueryRow(ctx, modeLockGetSQL, p.TenantID).Scan(&mode); err != nil {
			return nil, fmt.Errorf("lease: take: mode: %w", err)
		}
		if mode != ModeAuto {
			return nil, &ExactOnlyError{TenantID: p.TenantID, Rule: "lease mode " + string(mode)}
		}
		slice := p.WantMicro
		for _, lv := range levels {
			if lv.ExactOnly != "" {
				return nil, &ExactOnlyError{TenantID: lv.TenantID, Rule: lv.ExactOnly}
			}
			slice = min(slice, lv.BalanceMicro)
		}
		room, err := s.room(ctx, q, p.TenantID, "", levels)
		if err != nil {
			return nil, err
		}
		slice = min(slice, room)
		if slice < max(p.MinMicro, 1) {
			return nil, ErrShort
		}
		l.Levels = levelIDs(levels)
		l.SliceMicro, l.ExpiresAt = slice, now.Add(s.ttl)
		if _, err := q.Exec(ctx, leaseInsertSQL, l.ID, p.TenantID, s.holder, l.Levels, slice, now, l.ExpiresAt); err != nil {
			return nil, fmt.Errorf("lease: insert: %w", err)
		}
		return s.moves(levels, ledger.KindLeaseTake, l.ID, -slice, "take"), nil
	})
	if err != nil {
		return Lease{}, err
	}
	if s.groups {
		s.hints.know(l.ID)
	}
	return l, nil
}

// Renew books the lease's journal into the ledger (Book: without the
// lease row's lock, so its group commits go on), then, in a short
// transaction of its own under the tree's row locks and the lease row's,
// extends its life by the TTL from now and debits up to AddMicro more at
// every level (what the poorest level holds, perhaps nothing). It returns
// ErrOver if the lease is not live or already past its expiry (its holder
// must take a new one: admissions journaled before the expiry stay valid,
// and the sweeper or a Return refunds the rest).
func (s *Store) Renew(ctx context.Context, leaseID string, addMicro int64) (Lease, error) {
	if _, err := s.Book(ctx, leaseID); err != nil {
		return Lease{}, err
	}
	var out Lease
	err := s.withLease(ctx, leaseID, func(ctx context.Context, q account.LockedQuerier, now time.Time, levels []account.Level, r *row) ([]account.LevelMove, error) {
		if r.state != "live" || !now.Before(r.expiresAt) {
			return nil, ErrOver
		}
		var moves []account.LevelMove
		add := max(addMicro, 0)
		for _, lv := range levels {
			add = min(add, lv.BalanceMicro)
		}
		room, err := s.room(ctx, q, r.tenantID, leaseID, levels)
		if err != nil {
			return nil, err
		}
		add = min(add, room-(r.slice-r.used))
		add = max(add, 0) // a level in debt, or leases holding the cap, add nothing (and take nothing back)
		if add > 0 {
			moves = s.moves(levels, ledger.KindLeaseTake, leaseID, -add, "renew")
		}
		out = Lease{ID: leaseID, TenantID: r.tenantID, Levels: levelIDs(levels), SliceMicro: r.slice + add, UsedMicro: r.used, ExpiresAt: now.Add(s.ttl)}
		if _, err := q.Exec(ctx, leaseUpdateSQL, leaseID, out.SliceMicro, now, out.ExpiresAt); err != nil {
			return nil, fmt.Errorf("lease: renew: %w", err)
		}
		return moves, nil
	})
	return out, err
}

// Return ends a live lease: its journal is reconciled into the ledger and
// what it did not use is refunded at every level (a lease_return entry
// each, capped at capacity like every refund). It returns the unused
// amount, or ErrOver if the lease already ended.
func (s *Store) Return(ctx context.Context, leaseID string) (int64, error) {
	return s.end(ctx, leaseID, false)
}

// Sweep expires up to limit live leases past their expiry, as Return does
// (state expired): a replica that died, or was cut off, holds its budget
// no longer than the TTL after its last renew. It returns how many it
// expired.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	rows, err := s.acct.Pool().Query(ctx, leaseExpiredSQL, s.frozen(), limit)
	if err != nil {
		return 0, fmt.Errorf("lease: expired: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("lease: expired: %w", err)
	}
	n := 0
	for _, id := range ids {
		switch _, err := s.end(ctx, id, true); {
		case errors.Is(err, ErrOver):
		case err != nil:
			return n, err
		default:
			n++
		}
	}
	return n, nil
}

func (s *Store) end(ctx context.Context, leaseID string, onlyExpired bool) (int64, error) {
	// The backlog is booked first without the lease row's lock; the end
	// books what was journaled since, under it.
	if _, err := s.Book(ctx, leaseID); err != nil {
		return 0, err
	}
	var unused int64
	err := s.withLease(ctx, leaseID, func(ctx context.Context, q account.LockedQuerier, now time.Time, levels []account.Level, r *row) ([]account.LevelMove, error) {
		expired := !now.Before(r.expiresAt)
		if r.state != "live" || (onlyExpired && !expired) {
			return nil, ErrOver
		}
		moves, err := s.reconcile(ctx, q, leaseID, levels, 0, nil)
		if err != nil {
			return nil, err
		}
		unused = r.slice - r.used
		state, reason := "returned", "return"
		if expired {
			state, reason = "expired", "expiry"
		}
		if unused > 0 {
			moves = append(moves, s.moves(levels, ledger.KindLeaseReturn, leaseID, unused, reason)...)
		}
		if _, err := q.Exec(ctx, leaseEndSQL, leaseID, state, now); err != nil {
			return nil, fmt.Errorf("lease: end: %w", err)
		}
		return moves, nil
	})
	if err == nil || errors.Is(err, ErrOver) {
		s.hints.forget(leaseID) // (a lease left unknown is booked by the scan)
	}
	return unused, err
}

// room is what the tenant's leases other than except may take, under the
// tenant's row lock: MaxUnusedPercent of its capacity less what those
// leases hold unused (math.MaxInt64 with no cap). The percent is taken in
// two parts so that no capacity overflows.
func (s *Store) room(ctx context.Context, q account.LockedQuerier, tenantID, except string, levels []account.Level) (int64, error) {
	if s.pct == 0 {
		return math.MaxInt64, nil
	}
	var unused int64
	if err := q.QueryRow(ctx, leaseUnusedSQL, tenantID, except).Scan(&unused); err != nil {
		return 0, fmt.Errorf("lease: unused: %w", err)
	}
	c := levels[len(levels)-1].CapacityMicro
	return c/100*s.pct + c%100*s.pct/100 - unused, nil
}

// row is a lease's row, locked.
type row struct {
	tenantID            string
	state               string
	slice, used, booked int64
	expiresAt           time.Time
}

type leaseFunc func(ctx context.Context, q account.LockedQuerier, now time.Time, levels []account.Level, r *row) ([]account.LevelMove, error)

// withLease runs fn under the row locks of the lease's tree, then the
// lease row's. The tenant is read first without a lock (it never changes).
func (s *Store) withLease(ctx context.Context, leaseID string, fn leaseFunc) error {
	tenantID, err := s.tenantOf(ctx, leaseID)
	if err != nil {
		return err
	}
	_, err = s.acct.LockedLevels(ctx, tenantID, func(ctx context.Context, q account.LockedQuerier, now time.Time, levels []account.Level) ([]account.LevelMove, error) {
		r := &row{}
		if err := q.QueryRow(ctx, leaseLockSQL, leaseID).Scan(&r.tenantID, &r.state, &r.slice, &r.used, &r.booked, &r.expiresAt); err != nil {
			return nil, fmt.Errorf("lease: lock %s: %w", leaseID, err)
		}
		return fn(ctx, q, now, levels, r)
	})
	return err
}

// tenantOf is a lease's tenant, read without a lock (it never changes);
// ErrOver for no such lease.
func (s *Store) tenantOf(ctx context.Context, leaseID string) (tenantID string, err error) {
	if err := s.acct.Pool().QueryRow(ctx, leaseTenantSQL, leaseID).Scan(&tenantID); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return "", ErrOver
		}
		return "", fmt.Errorf("lease: tenant of %s: %w", leaseID, err)
	}
	return tenantID, nil
}

// moves is one move of delta at every level, each with its entry.
func (s *Store) moves(levels []account.Level, kind ledger.Kind, leaseID string, delta int64, reason string) []account.LevelMove {
	detail, _ := json.Marshal(struct {
		Holder string `json:"holder"`
		TTLMS  int64  `json:"ttl_ms"`
	}{s.holder, s.ttl.Milliseconds()})
	out := make([]account.LevelMove, len(levels))
	for i, lv := range levels {
		out[i] = account.LevelMove{TenantID: lv.TenantID, Kind: kind, DeltaMicro: delta, Ref: leaseID, Actor: "lease", Reason: "lease " + reason, Detail: string(detail)}
	}
	return out
}

// Outstanding is what live leases taken at a level (the tenant's own and
// its descendants') hold and have not used: the most an admission at that
// level can be refused for budget that sits in leases.
func (s *Store) Outstanding(ctx context.Context, tenantID string) (int64, error) {
	rows, err := s.acct.Pool().Query(ctx, leaseLiveSQL, tenantID)
	if err != nil {
		return 0, fmt.Errorf("lease: live: %w", err)
	}
	var sum int64
	var id string
	var slice, used int64
	_, err = pgx.ForEachRow(rows, []any{&id, &slice, &used}, func() error { sum += slice - used; return nil })
	if err != nil {
		return 0, fmt.Errorf("lease: live: %w", err)
	}
	return sum, nil
}

func levelIDs(levels []account.Level) []string {
	ids := make([]string, len(levels))
	for i, lv := range levels {
		ids[i] = lv.TenantID
	}
	return ids
}

// newID is a lease's id: random, so replicas need no coordination.
func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "lse_" + hex.EncodeToString(b[:])
}
