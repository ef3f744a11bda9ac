package account

// Admissions made from a lease (budget/lease, docs/leasing.md) are written
// once, where they live: a journal group commit inserts their admissions
// and Idempotency-Key rows (QueueLeased), and their lease's booking (a
// renew, a return, the sweeper, or a decision that ends one of them) later
// appends their chained ledger entries (LeasedToBook and LeasedMoves, under
// LockedLevels). account owns admissions, idempotency_keys and the booking
// cursor, so a decision that ends a leased admission not booked yet books
// its lease itself (leaseBookRead, bookLeases).

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
	"github.com/tokengate/tokengate/ledger/pgarray"
)

var (
	//go:embed sql/idempotency_key_lock.sql
	idempotencyKeyLockSQL string
	//go:embed sql/admission_insert_leased.sql
	admissionInsertLeasedSQL string
	//go:embed sql/idempotency_forget.sql
	idempotencyForgetSQL string
	//go:embed sql/admission_lease_book.sql
	admissionLeaseBookSQL string
	//go:embed sql/admission_lease_pending.sql
	admissionLeasePendingSQL string
	//go:embed sql/admission_lease_book_named.sql
	admissionLeaseBookNamedSQL string
	//go:embed sql/admission_end_leased.sql
	admissionEndLeasedSQL string
	//go:embed sql/admission_lease.sql
	admissionLeaseSQL string
	//go:embed sql/admission_insert_group.sql
	admissionInsertGroupSQL string
)

// EnableLeasing tells the store that leases may be journaled on its
// database (budget/lease.New calls it): from then on a keyed reserve takes
// its key's advisory lock when its tenant has a live lease, as a journal
// group does. Until then decisions take none: a store no lease was made on
// pays nothing for leasing. (Booking needs no such switch: a decision that
// ends a leased admission books its lease whatever the store, see
// leaseBookRead.)
func (s *Store) EnableLeasing() { s.leasing.Store(true) }

// QueueKeyLock queues the advisory locks of (tenant, key) pairs
// (idempotency_key_lock.sql): the lease journal takes them before it reads
// and writes keys, as a decision does before it reads them (a decision
// only for the tenants with a live lease: keyLockRead).
func QueueKeyLock(b *pgx.Batch, tenants, keys []string) {
	b.Queue(idempotencyKeyLockSQL, pgarray.Texts(tenants), pgarray.Texts(keys), false)
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
	money, ttls                                                                          []*int64
	hashes, responses                                                                    [][]byte
}

// Add adds a, made from leaseID by actor, with its Idempotency-Key as
// stored (Face.StoredKey; "" for none), its request hash and the answer a
// retry replays (nil: ReplayNow). a.TenantID must be the lease's tenant; a
// zero ExpiresAt is its created_at plus ttl, the tenant's reservation TTL
// as the caller knows it (zero: the tenant's row is read for it).
func (l *Leased) Add(leaseID, actor string, a *Admission, key string, hash, response []byte, ttl time.Duration) {
	e := a.Estimate
	var expires *time.Time
	if !a.ExpiresAt.IsZero() {
		t := a.ExpiresAt
		expires = &t
	}
	var ttlMS *int64
	if ms := ttl.Milliseconds(); ms > 0 {
		ttlMS = &ms
	}
	l.ttls = append(l.ttls, ttlMS)
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

// Grow makes room for n more admissions, so that adding a group's
// admissions grows none of l's 21 columns (2 % of a replica's CPU on the
// rate limit service, where every column grew four times per group).
func (l *Leased) Grow(n int) {
	for _, c := range []*[]string{&l.ids, &l.tenants, &l.models, &l.families, &l.priceModels, &l.faces, &l.priceTiers, &l.leases, &l.actors, &l.keys} {
		*c = slices.Grow(*c, n)
	}
	for _, c := range []*[]int64{&l.in, &l.out, &l.cost, &l.inW, &l.outW} {
		*c = slices.Grow(*c, n)
	}
	l.approx = slices.Grow(l.approx, n)
	l.expires, l.priceFrom = slices.Grow(l.expires, n), slices.Grow(l.priceFrom, n)
	l.money, l.ttls = slices.Grow(l.money, n), slices.Grow(l.ttls, n)
	l.hashes, l.responses = slices.Grow(l.hashes, n), slices.Grow(l.responses, n)
}

// QueueLeased queues the insert of l's admissions rows (state reserved,
// created_at by clock, nil: the database's) and of their Idempotency-Key
// rows, in one statement (admission_insert_leased.sql). The caller holds
// the row lock of every lease named, to its commit, and the advisory locks
// of the keys. A key idempotency_keys already holds is never written over:
// the statement fails (unique_violation) if one of l's is there, live or
// forgotten, so a caller that read them first leaves the live ones out
// and deletes the forgotten ones (QueueKeysForget), and one that did not
// writes the group again, reading first.
func QueueLeased(b *pgx.Batch, l *Leased, clock *time.Time) {
	b.Queue(admissionInsertLeasedSQL, pgarray.Texts(l.ids), pgarray.Texts(l.tenants), pgarray.Texts(l.models),
		pgarray.Int8s(l.in), pgarray.Int8s(l.out), pgarray.Int8s(l.cost), pgarray.Bools(l.approx), pgarray.Int8s(l.inW), pgarray.Int8s(l.outW),
		pgarray.NullTimestamptzs(l.expires), pgarray.Texts(l.families), pgarray.Texts(l.priceModels),
		pgarray.NullTimestamptzs(l.priceFrom), pgarray.NullInt8s(l.money), pgarray.Texts(l.faces), pgarray.Texts(l.priceTiers),
		pgarray.Texts(l.leases), pgarray.Texts(l.actors), pgarray.Texts(l.keys), pgarray.Byteas(l.hashes), pgarray.Byteas(l.responses), clock,
		pgarray.NullInt8s(l.ttls))
}

// QueueKeysForget queues the delete of the forgotten Idempotency-Keys
// (older than 24 h by clock) among (tenant, key) pairs
// (idempotency_forget.sql), for the lease journal's careful way, under the
// keys' advisory locks: its insert (QueueLeased) then writes them anew, as
// a decision replaces a forgotten key (idempotency_put.sql).
func QueueKeysForget(b *pgx.Batch, tenants, keys []string, clock *time.Time) {
	b.Queue(idempotencyForgetSQL, tenants, keys, clock)
}

// LeasedEnds are ends of admissions made from leases, as a journal group
// makes them (QueueLeasedEnds): a column each.
type LeasedEnds struct {
	ids, leases            []string
	in, out, cost, refunds []int64
	money                  []*int64
}

// Add adds the end of admission id, made from leaseID, at in and out
// tokens costing cost tokens (money: nil with no price), whose refund
// (micro-tokens) the group took off the lease's use.
func (e *LeasedEnds) Add(id, leaseID string, in, out, cost int64, money *int64, refundMicro int64) {
	e.ids, e.leases = append(e.ids, id), append(e.leases, leaseID)
	e.in, e.out, e.cost, e.refunds = append(e.in, in), append(e.out, out), append(e.cost, cost), append(e.refunds, refundMicro)
	e.money = append(e.money, money)
}

// Len is how many ends e holds.
func (e *LeasedEnds) Len() int { return len(e.ids) }

// QueueLeasedEnds queues e's ends (admission_end_leased.sql), after the
// group's use of their leases: each open admission is settled in its
// lease's order, and the refund of one that is not open is added back to
// its lease's use. all: the group was sent in one round trip, and must end
// every one or stop (GuardCode). ScanLeasedEnds reads which ended.
func QueueLeasedEnds(b *pgx.Batch, e *LeasedEnds, clock *time.Time, all bool) {
	b.Queue(admissionEndLeasedSQL, pgarray.Texts(e.ids), pgarray.Texts(e.leases), pgarray.Int8s(e.in), pgarray.Int8s(e.out),
		pgarray.Int8s(e.cost), pgarray.NullInt8s(e.money), pgarray.Int8s(e.refunds), clock, all)
}

// QueueLeasedGroup queues l's admissions and e's ends in the groups shape
// of the compact journal (00039; admission_insert_group.sql), in one
// statement: l's admissions as one lease_groups row with its state row
// and their Idempotency-Key rows, as QueueLeased writes them as rows, and
// e's ends as QueueLeasedEnds makes them, each marked in the state row of
// the group its id names. replica is the holder of the leases (the
// booking reads their events by it). Every admission of l must have a
// grouped id of one group (rule.GroupedAdmissionID): a reader finds it by
// its id alone. ScanLeasedEnds reads which ends were made.
func QueueLeasedGroup(b *pgx.Batch, replica string, holder uint64, count uint32, l *Leased, e *LeasedEnds, clock *time.Time, all bool) {
	g := rule.AdmissionGroup{Holder: holder, Count: count}
	holders, counts := make([]int64, len(e.ids)), make([]int64, len(e.ids))
	for i, id := range e.ids {
		if eg, ok := rule.AdmissionGroupOf(id); ok {
			holders[i], counts[i] = int64(eg.Holder), int64(eg.Count)
		}
	}
	b.Queue(admissionInsertGroupSQL, replica, int64(g.Holder), int64(g.Count), clock,
		pgarray.Texts(l.ids), pgarray.Texts(l.tenants), pgarray.Texts(l.leases), pgarray.Texts(l.models),
		pgarray.Int8s(l.in), pgarray.Int8s(l.out), pgarray.Int8s(l.cost), pgarray.Bools(l.approx), pgarray.Int8s(l.inW), pgarray.Int8s(l.outW),
		pgarray.NullTimestamptzs(l.expires), pgarray.NullInt8s(l.ttls), pgarray.Texts(l.families), pgarray.Texts(l.priceModels),
		pgarray.NullTimestamptzs(l.priceFrom), pgarray.NullInt8s(l.money), pgarray.Texts(l.faces), pgarray.Texts(l.priceTiers),
		pgarray.Texts(l.actors), pgarray.Texts(l.keys), pgarray.Byteas(l.hashes), pgarray.Byteas(l.responses),
		pgarray.Texts(e.ids), pgarray.Texts(e.leases), pgarray.Int8s(e.in), pgarray.Int8s(e.out),
		pgarray.Int8s(e.cost), pgarray.NullInt8s(e.money), pgarray.Int8s(e.refunds), pgarray.Int8s(holders), pgarray.Int8s(counts), all)
}

// ScanLeasedEnds reads what QueueLeasedEnds queued: the admissions ended.
func ScanLeasedEnds(br pgx.BatchResults) (map[string]bool, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("budget: leased ends: %w", err)
	}
	ended := map[string]bool{}
	var id string
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { ended[id] = true; return nil }); err != nil {
		return nil, fmt.Errorf("budget: leased ends: %w", err)
	}
	return ended, nil
}

// GuardCode is the SQLSTATE of lease_journal_guard (00035): a group sent
// in one round trip could not be written as sent (a lease refused it, a
// key of it is live, a credential changed), and nothing of it was.
const GuardCode = "TG001"

// DuplicateAdmission reports whether err is the insert of an admission
// whose id is taken.
func DuplicateAdmission(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "admissions_pkey"
}

// LeasedAdmission is an event of a lease whose ledger entries are to be
// written (LeasedToBook): an admission made from it, or (Ended) the end of
// one its journal made (00036).
type LeasedAdmission struct {
	ID, TenantID, Model, Actor string
	Cost                       int64
	MoneyMicro                 *int64
	// CreatedAt is when the admission was journaled, or, Ended, when it
	// ended.
	CreatedAt time.Time
	Seq       int64
	// Ended: the event is the admission's end, settled at ActualCost
	// tokens (MoneyActual its money, nil with no price), its refund gone
	// back into the lease.
	Ended       bool
	ActualCost  *int64
	MoneyActual *int64
}

// scanTargets are where a booking statement's event columns are scanned.
func (a *LeasedAdmission) scanTargets() []any {
	return []any{&a.ID, &a.TenantID, &a.Model, &a.Cost, &a.MoneyMicro, &a.CreatedAt, &a.Actor, &a.Seq, &a.Ended, &a.ActualCost, &a.MoneyActual}
}

// LeaseGroups names the group rows of a groups-shape journal (00039) that
// hold a lease's events to book, by the group their ids name (holder and
// count): what the lease's journal recorded since its last booking.
type LeaseGroups struct{ holders, counts []int64 }

// Add names one group.
func (g *LeaseGroups) Add(holder uint64, count uint32) {
	g.holders, g.counts = append(g.holders, int64(holder)), append(g.counts, int64(count))
}

// LeasedToBook returns the lease's admissions whose ledger entries are
// still to write, up to limit (0: all) in the order journaled, and moves
// the lease's booking cursor past them (admission_lease_book.sql). The
// caller holds the row locks of the lease's tree (q) and writes their
// entries (LeasedMoves) in the same transaction. groups, when not nil, are
// the only group rows read (the lease's journal's record of them); nil
// reads every group of the lease's holder above the cursor.
func LeasedToBook(ctx context.Context, q LockedQuerier, leaseID string, limit int, groups *LeaseGroups) ([]LeasedAdmission, error) {
	lim := any(nil)
	if limit > 0 {
		lim = limit
	}
	var holders, counts []int64 // nil: read the holder's groups
	if groups != nil {
		holders, counts = append([]int64{}, groups.holders...), append([]int64{}, groups.counts...)
	}
	rows, err := q.Query(ctx, admissionLeaseBookSQL, leaseID, lim, holders, counts)
	if err != nil {
		return nil, fmt.Errorf("budget: lease %s: admissions to book: %w", leaseID, err)
	}
	var out []LeasedAdmission
	var a LeasedAdmission
	_, err = pgx.ForEachRow(rows, a.scanTargets(), func() error {
		out = append(out, a)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("budget: lease %s: admissions to book: %w", leaseID, err)
	}
	return out, nil
}

// LeasedMoves are the ledger entries that book a lease's events, in the
// order given: a reserve entry at every level for each admission, which
// moves nothing (the lease's take debited its cost) and opens it there,
// with the admission's id, model, estimate and money, its actor ("lease"
// for none), and {"lease", "cost_micro", "journaled_at"} as its detail; a
// settle entry at every level for each end, which moves nothing either
// (its refund went back into the lease, and leaves it with the lease's
// return) and closes it there, with its estimate, actual and the money
// moved, and {"lease", "refund_micro", "ended_at"} as its detail.
func LeasedMoves(levels []Level, leaseID string, adms []LeasedAdmission) []LevelMove {
	moves := make([]LevelMove, 0, len(adms)*len(levels))
	lease := leaseDetailPrefix(leaseID)
	for _, a := range adms {
		if a.Ended {
			moves = append(moves, leasedEndMoves(levels, leaseID, lease, a)...)
			continue
		}
		detail := leaseDetail(lease, "cost_micro", a.Cost*rule.Micro, "journaled_at", a.CreatedAt)
		actor := a.Actor
		if actor == "" {
			actor = "lease"
		}
		for _, lv := range levels {
			cost := a.Cost
			moves = append(moves, LevelMove{TenantID: lv.TenantID, Kind: ledger.KindReserve, Ref: a.ID, Model: a.Model,
				Estimate: &cost, MoneyMicro: a.MoneyMicro, Actor: actor, Reason: "admitted from a lease", Detail: string(detail), Opens: true, Lease: leaseID})
		}
	}
	return moves
}

// leasedEndMoves are the settle entries of an end made in a lease's
// journal (LeasedMoves).
func leasedEndMoves(levels []Level, leaseID string, lease []byte, a LeasedAdmission) []LevelMove {
	actual := deref(a.ActualCost)
	detail := leaseDetail(lease, "refund_micro", (a.Cost-actual)*rule.Micro, "ended_at", a.CreatedAt)
	var money *int64
	if a.MoneyMicro != nil && a.MoneyActual != nil {
		moved := *a.MoneyActual - *a.MoneyMicro
		money = &moved
	}
	actor := a.Actor
	if actor == "" {
		actor = "lease"
	}
	moves := make([]LevelMove, 0, len(levels))
	for _, lv := range levels {
		cost, act := a.Cost, actual
		moves = append(moves, LevelMove{TenantID: lv.TenantID, Kind: ledger.KindSettle, Ref: a.ID, Model: a.Model,
			Estimate: &cost, Actual: &act, MoneyMicro: money, Actor: actor, Reason: "settled in a lease's journal",
			Detail: string(detail), Closes: true, Lease: leaseID})
	}
	return moves
}

// leaseDetailPrefix is `{"lease":<id>` as encoding/json writes it, the
// start every booked entry's detail shares (leaseDetail).
func leaseDetailPrefix(leaseID string) []byte {
	id, _ := json.Marshal(leaseID)
	return append([]byte(`{"lease":`), id...)
}

// leaseDetail is a booked entry's detail, {"lease":..,num:n,at:t}, byte for
// byte what encoding/json makes of that struct (t in RFC 3339 with
// nanoseconds, UTC, needs no escaping), appended by hand: a booking writes
// one per admission per level, and reflection was a tenth of its CPU
// (BenchmarkBookingEntries). TestLeaseDetailAsEncodingJSON holds it.
func leaseDetail(prefix []byte, num string, n int64, at string, t time.Time) string {
	b := make([]byte, 0, len(prefix)+len(num)+len(at)+64)
	b = append(b, prefix...)
	b = append(b, `,"`...)
	b = append(b, num...)
	b = append(b, `":`...)
	b = strconv.AppendInt(b, n, 10)
	b = append(b, `,"`...)
	b = append(b, at...)
	b = append(b, `":"`...)
	b = t.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `"}`...)
	return string(b)
}

// AdmissionLease returns the lease an admission was made from ("" for
// none, or no such admission): a lease's bookings store its admissions'
// ledger entries in records found through the lease (ledger.Filter.Lease).
func (s *Store) AdmissionLease(ctx context.Context, admissionID string) (string, error) {
	var lease string
	err := s.pool.QueryRow(ctx, admissionLeaseSQL, admissionID).Scan(&lease)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("budget: admission %s: lease: %w", admissionID, err)
	}
	return lease, nil
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
// are read, when leasing is enabled (then a key may be written by a
// journal group without the tenant's lock), and only for the tenants with
// a live lease, decided in the statement, under the tenant rows' locks
// (idempotency_key_lock.sql says why that is enough). The statement reads
// leases, budget/lease's table, because the decision must make it in the
// lock round trip, with no read of its own.
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

// keyLocks are the key locks a batch takes before its reads, if leasing is
// enabled.
func (s *Store) keyLocks(w wants) []read {
	if !s.leasing.Load() || len(w.idempotency.keys) == 0 {
		return nil
	}
	return []read{keyLockRead{pairs: w.idempotency}}
}

// leaseBookRead reads, after the admissions a batch ends are locked (the
// statement before it), the leased admissions to book first: for each
// lease of an ended admission whose entries are still to write, the
// lease's admissions above its cursor up to the last one ended, which it
// moves past them (admission_lease_book_named.sql), in the same round trip. Queued for
// every batch that ends admissions, leasing enabled or not: an end's entry
// must follow its reserve's whichever store decides it.
type leaseBookRead struct {
	ids     []string
	namedBy tenantKeys
	clock   *time.Time
	l       *loaded
}

func (r leaseBookRead) queue(b *pgx.Batch) {
	b.Queue(admissionLeaseBookNamedSQL, r.ids, r.namedBy.tenants, r.namedBy.keys, r.clock)
}

func (r leaseBookRead) scan(br pgx.BatchResults) error {
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("budget: leased admissions to book: %w", err)
	}
	var lease string
	var a LeasedAdmission
	_, err = pgx.ForEachRow(rows, append([]any{&lease}, a.scanTargets()...), func() error {
		if r.l.toBook == nil {
			r.l.toBook = map[string][]LeasedAdmission{}
		}
		r.l.toBook[lease] = append(r.l.toBook[lease], a)
		return nil
	})
	if err != nil {
		return fmt.Errorf("budget: leased admissions to book: %w", err)
	}
	return nil
}

// bookLeases books, after the lock round trip, the leases leaseBookRead
// found: their admissions' reserve entries, in this transaction, under the
// tenant rows it holds (an admission's tenant is its lease's), before the
// batch's own entries, so that an end's entry follows its reserve's.
func (s *Store) bookLeases(l *loaded) error {
	if len(l.toBook) == 0 {
		return nil
	}
	if l.pre == nil {
		l.pre = &writes{}
	}
	for _, id := range slices.Sorted(maps.Keys(l.toBook)) {
		adms := l.toBook[id]
		t := l.tenants[adms[0].TenantID]
		if t == nil {
			return fmt.Errorf("budget: lease %s: tenant %s is not locked", id, adms[0].TenantID)
		}
		chain, err := chainOf(l.tenants, t)
		if err != nil {
			return err
		}
		levels, byID := levelsOf(chain, l.now)
		if _, err := applyMoves(byID, LeasedMoves(levels, id, adms), l.now, l.pre); err != nil {
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
		if m.Closes {
			lv.Open = max(0, lv.Open-1)
		}
		e := lv.entry(m.Kind, now, actorOr(m.Actor, "lease"))
		e.DeltaMicro, e.AdmissionID, e.Model, e.Estimate, e.MoneyMicro = d, m.Ref, m.Model, m.Estimate, m.MoneyMicro
		e.Actual = m.Actual
		e.Reason, e.Detail, e.Lease = m.Reason, m.Detail, m.Lease
		lv.seal(e)
		w.entry(lv, e)
	}
	return applied, nil
}
