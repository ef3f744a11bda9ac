package account

// Admissions made from a lease (budget/lease, docs/leasing.md) are written
// once, where they live: a journal group commit inserts their admissions
// and Idempotency-Key rows (QueueLeased), and their lease's booking (a
// renew, a return, the sweeper, or a decision that ends one of them) later
// appends their chained ledger entries (LeasedToBook, then LockedLevels
// with moves that open them). account owns admissions, idempotency_keys
// and the booking cursor; budget/lease imports this package, so a decision
// reaches the booking through the LeaseBooker a lease store registers.

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var (
	//go:embed sql/idempotency_key_lock.sql
	idempotencyKeyLockSQL string
	//go:embed sql/admission_insert_leased.sql
	admissionInsertLeasedSQL string
	//go:embed sql/admission_lease_book.sql
	admissionLeaseBookSQL string
	//go:embed sql/admission_lease_pending.sql
	admissionLeasePendingSQL string
)

// LeaseBooker books a lease's admissions into the ledger under the row
// locks of its tree: budget/lease implements it and registers it
// (SetLeaseBooker). A decision that settles or releases an admission made
// from a lease whose ledger entries are still to write (admission_lock.sql
// names its lease) books that lease first, in its own transaction, so that
// the end's entry follows the reserve's; and a decision that reserves with
// an Idempotency-Key of a tenant with a live lease takes the key's advisory
// lock, as a journal group does.
type LeaseBooker interface {
	// BookLocked books a lease's admissions under the row locks of its
	// tree, held by q: the moves are their reserve entries (LeasedToBook).
	BookLocked(ctx context.Context, q LockedQuerier, now time.Time, levels []Level, leaseID string) ([]LevelMove, error)
}

type leaseBookerBox struct{ b LeaseBooker }

// SetLeaseBooker registers the lease booker the store's decisions use
// (budget/lease.New does it). Until then decisions take no key locks for
// leases: a store no lease was made on pays nothing for leasing.
func (s *Store) SetLeaseBooker(b LeaseBooker) {
	s.leaseBooker.Store(&leaseBookerBox{b: b})
}

func (s *Store) booker() LeaseBooker {
	if b := s.leaseBooker.Load(); b != nil {
		return b.b
	}
	return nil
}

// QueueKeyLock queues the advisory locks of (tenant, key) pairs
// (idempotency_key_lock.sql): the lease journal takes them before it reads
// and writes keys, as a decision does before it reads them (a decision
// only for the tenants with a live lease: keyLockRead).
func QueueKeyLock(b *pgx.Batch, tenants, keys []string) {
	b.Queue(idempotencyKeyLockSQL, tenants, keys, false)
}

// KeyHit is a live Idempotency-Key of idempotency_keys.
type KeyHit struct {
	TenantID, Key, AdmissionID string
	RequestHash, Response      []byte
}

// QueueKeysGet queues the read of the live keys among (tenant, key) pairs
// (idempotency_get.sql), for the lease journal: a key idempotency_keys
// holds makes a second admission with it a replay.
func QueueKeysGet(b *pgx.Batch, tenants, keys []string, clock *time.Time) {
	b.Queue(idempotencyGetSQL, tenants, keys, clock)
}

// ScanKeysGet reads what QueueKeysGet queued.
func ScanKeysGet(br pgx.BatchResults) ([]KeyHit, error) {
	var out []KeyHit
	var h KeyHit
	err := eachRow(br, "idempotency keys", []any{&h.TenantID, &h.Key, &h.AdmissionID, &h.RequestHash, &h.Response}, func() { out = append(out, h) })
	return out, err
}

// Leased are admissions made from leases, as a journal group commit
// writes them (QueueLeased): a column each.
type Leased struct {
	ids, tenants, models, families, priceModels, faces, priceTiers, leases, actors, keys []string
	in, out, cost, inW, outW                                                             []int64
	approx                                                                               []bool
	expires, priceFrom                                                                   []*time.Time
	money                                                                                []*int64
	hashes, responses                                                                    [][]byte
}

// Add adds a, made from leaseID by actor, with its Idempotency-Key as
// stored (Face.StoredKey; "" for none), its request hash and the answer a
// retry replays (nil: ReplayNow). a.TenantID must be the lease's tenant; a
// zero ExpiresAt is its created_at plus the tenant's reservation TTL.
func (l *Leased) Add(leaseID, actor string, a *Admission, key string, hash, response []byte) {
	e := a.Estimate
	var expires *time.Time
	if !a.ExpiresAt.IsZero() {
		t := a.ExpiresAt
		expires = &t
	}
	if key != "" {
		if hash == nil {
			hash = []byte{}
		}
		if response == nil {
			response = []byte{} // NOT NULL: empty is "replay now"
		}
	}
	l.ids, l.tenants, l.models, l.families = append(l.ids, a.ID), append(l.tenants, a.TenantID), append(l.models, e.Model), append(l.families, a.Family)
	l.priceModels, l.faces, l.priceTiers = append(l.priceModels, a.PriceModel), append(l.faces, string(a.Face.Or())), append(l.priceTiers, a.PriceTier)
	l.leases, l.actors, l.keys = append(l.leases, leaseID), append(l.actors, actor), append(l.keys, key)
	l.in, l.out, l.cost = append(l.in, e.InputTokens), append(l.out, e.OutputTokens), append(l.cost, e.Cost)
	l.inW, l.outW, l.approx = append(l.inW, e.InputWeightMicro), append(l.outW, e.OutputWeightMicro), append(l.approx, e.Approximate)
	l.expires, l.priceFrom, l.money = append(l.expires, expires), append(l.priceFrom, a.PriceFrom), append(l.money, a.MoneyEstimate)
	l.hashes, l.responses = append(l.hashes, hash), append(l.responses, response)
}

// Len is how many admissions l holds.
func (l *Leased) Len() int { return len(l.ids) }

// QueueLeased queues the insert of l's admissions rows (state reserved,
// created_at by clock, nil: the database's) and of their Idempotency-Key
// rows, in one statement (admission_insert_leased.sql). The caller holds
// the row lock of every lease named, to its commit, and the advisory locks
// of the keys, which it read first: a live key is a replay, never written.
func QueueLeased(b *pgx.Batch, l *Leased, clock *time.Time) {
	b.Queue(admissionInsertLeasedSQL, l.ids, l.tenants, l.models, l.in, l.out, l.cost, l.approx, l.inW, l.outW,
		l.expires, l.families, l.priceModels, l.priceFrom, l.money, l.faces, l.priceTiers, l.leases, l.actors,
		l.keys, l.hashes, l.responses, clock)
}

// DuplicateAdmission reports whether err is the insert of an admission
// whose id is taken.
func DuplicateAdmission(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "admissions_pkey"
}

// LeasedAdmission is an admission made from a lease whose ledger entries
// are to be written (LeasedToBook).
type LeasedAdmission struct {
	ID, TenantID, Model, Actor string
	Cost                       int64
	MoneyMicro                 *int64
	CreatedAt                  time.Time
	Seq                        int64
}

// LeasedToBook returns the lease's admissions whose ledger entries are
// still to write, up to limit (0: all) in the order journaled, and moves
// the lease's booking cursor past them (admission_lease_book.sql). The
// caller holds the row locks of the lease's tree (q) and writes their
// entries in the same transaction.
func LeasedToBook(ctx context.Context, q LockedQuerier, leaseID string, limit int) ([]LeasedAdmission, error) {
	lim := any(nil)
	if limit > 0 {
		lim = limit
	}
	rows, err := q.Query(ctx, admissionLeaseBookSQL, leaseID, lim)
	if err != nil {
		return nil, fmt.Errorf("budget: lease %s: admissions to book: %w", leaseID, err)
	}
	var out []LeasedAdmission
	var a LeasedAdmission
	_, err = pgx.ForEachRow(rows, []any{&a.ID, &a.TenantID, &a.Model, &a.Cost, &a.MoneyMicro, &a.CreatedAt, &a.Actor, &a.Seq}, func() error {
		out = append(out, a)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("budget: lease %s: admissions to book: %w", leaseID, err)
	}
	return out, nil
}

// LeasePending reports whether a lease has admissions whose ledger entries
// are still to write, read without a lock.
func (s *Store) LeasePending(ctx context.Context, leaseID string) (bool, error) {
	var pending bool
	if err := s.pool.QueryRow(ctx, admissionLeasePendingSQL, leaseID).Scan(&pending); err != nil {
		return false, fmt.Errorf("budget: lease %s: pending: %w", leaseID, err)
	}
	return pending, nil
}

// keyLockRead takes the advisory locks of the reserves' keys, before they
// are read, when a lease booker is registered (then a key may be written
// by a journal group without the tenant's lock), and only for the tenants
// with a live lease, decided in the statement, under the tenant rows'
// locks (idempotency_key_lock.sql says why that is enough). The statement
// reads leases, budget/lease's table, because the decision must make it in
// the lock round trip, with no read of its own.
type keyLockRead struct{ pairs tenantKeys }

func (r keyLockRead) queue(b *pgx.Batch) {
	b.Queue(idempotencyKeyLockSQL, r.pairs.tenants, r.pairs.keys, true)
}

func (r keyLockRead) scan(br pgx.BatchResults) error {
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("budget: key locks: %w", err)
	}
	return nil
}

// keyLocks are the key locks a batch takes before its reads, if a lease
// booker is registered.
func (s *Store) keyLocks(w wants) []read {
	if s.booker() == nil || len(w.idempotency.keys) == 0 {
		return nil
	}
	return []read{keyLockRead{pairs: w.idempotency}}
}

// bookLeases books, after the lock round trip, the lease of every
// admission the batch ends whose ledger entries are still to write
// (admission_lock.sql's unbooked_lease): in this transaction, under the
// tenant rows it holds (reserve entries that move nothing), so that the
// end's entry follows the reserve's.
func (s *Store) bookLeases(ctx context.Context, l *loaded) error {
	if len(l.unbooked) == 0 {
		return nil
	}
	b := s.booker()
	if b == nil {
		return fmt.Errorf("budget: admissions of leases %v are not booked and no lease booker is registered", slices.Collect(maps.Keys(l.unbooked)))
	}
	ids := slices.Sorted(maps.Keys(l.unbooked))
	if l.pre == nil {
		l.pre = &writes{}
	}
	for _, id := range ids {
		t := l.tenants[l.unbooked[id]]
		if t == nil {
			return fmt.Errorf("budget: lease %s: tenant %s is not locked", id, l.unbooked[id])
		}
		chain, err := chainOf(l.tenants, t)
		if err != nil {
			return err
		}
		levels, byID := levelsOf(chain, l.now)
		moves, err := b.BookLocked(ctx, l.tx.conn, l.now, levels, id)
		if err != nil {
			return fmt.Errorf("budget: book lease %s: %w", id, err)
		}
		if _, err := applyMoves(byID, moves, l.now, l.pre); err != nil {
			return err
		}
	}
	return nil
}

// levelsOf brings chain to now and describes it as LockedLevels' levels.
func levelsOf(chain []*tenant, now time.Time) ([]Level, map[string]*tenant) {
	levels := make([]Level, len(chain))
	byID := make(map[string]*tenant, len(chain))
	for i, lv := range chain {
		lv.advance(now)
		byID[lv.id] = lv
		levels[i] = Level{TenantID: lv.id, BalanceMicro: lv.Tokens.BalanceMicro, CapacityMicro: lv.Tokens.CapacityMicro, RateMicro: lv.Tokens.RateMicro, ExactOnly: lv.exactOnly()}
	}
	return levels, byID
}

// applyMoves applies moves to the levels (byID) at now, each with its
// sealed entry, recorded in w. It returns the deltas applied.
func applyMoves(byID map[string]*tenant, moves []LevelMove, now time.Time, w *writes) ([]int64, error) {
	applied := make([]int64, len(moves))
	for i, m := range moves {
		lv := byID[m.TenantID]
		if lv == nil {
			return nil, fmt.Errorf("budget: tenant %s is not a level of the tree", m.TenantID)
		}
		d := m.DeltaMicro
		switch {
		case d < 0 && lv.Tokens.BalanceMicro+d < 0:
			return nil, fmt.Errorf("budget: tenant %s: %w", m.TenantID, ErrLevelShort)
		case d < 0:
			lv.Tokens.BalanceMicro += d
		case d > 0:
			d = lv.Tokens.Refund(d)
		}
		applied[i] = d
		if m.Opens {
			lv.Open++
		}
		e := lv.entry(m.Kind, now, actorOr(m.Actor, "lease"))
		e.DeltaMicro, e.AdmissionID, e.Model, e.Estimate, e.MoneyMicro = d, m.Ref, m.Model, m.Estimate, m.MoneyMicro
		e.Reason, e.Detail = m.Reason, m.Detail
		lv.seal(e)
		w.entry(lv, e)
	}
	return applied, nil
}
