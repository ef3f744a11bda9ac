package account

// Admissions made from a lease (budget/lease, docs/leasing.md) become
// admissions rows when their lease is booked: by a renew, a return or the
// sweeper (LockedLevels with moves that carry them), or by a decision that
// settles, releases or replays one still only in the lease journal, in its
// own transaction (LeaseJournal). account owns admissions and
// idempotency_keys; the journal's table is budget/lease's, which imports
// this package, so the decision reaches it through the LeaseJournal a
// lease store registers.

import (
	"context"
	_ "embed"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/ledger"
)

//go:embed sql/idempotency_key_lock.sql
var idempotencyKeyLockSQL string

// AdmissionKey is the Idempotency-Key an admission made from a lease was
// journaled with (Key as stored: Face.StoredKey), written with its
// admissions row when it is booked.
type AdmissionKey struct {
	Key         string
	RequestHash []byte
	Response    []byte // EncodeReservation of its answer; empty: ReplayNow
}

// JournalHit is a lease journal row a decision's load found, by admission
// id or by (tenant, key).
type JournalHit struct {
	LeaseID, AdmissionID, TenantID, Key string
	// Booked: its admissions row (and key row) exist already.
	Booked      bool
	RequestHash []byte
	Response    []byte
}

// LeaseJournal is the lease journal as a decision needs it: budget/lease
// implements it and registers it (SetLeaseJournal). A decision that
// settles or releases an admission, or reserves with an Idempotency-Key,
// of a tenant with a live lease, reads the journal in its lock round trip
// (of any other tenant: nothing, decided in the statement); it books (in its own
// transaction, under the tenant rows it holds) the lease of every
// admission it ends that is still only in the journal, so that the end
// finds the admissions row; and a reserve whose key the journal holds is a
// replay of that admission.
type LeaseJournal interface {
	// QueueJournalFind queues the read of the journal rows of the
	// admissions named by id (ids[i] by a request of idTenants[i]), or by
	// (tenant, key) (keys live 24 h by clock, nil: the database's), of
	// the tenants that have a live lease only. It is queued after the
	// tenant rows are locked, in the same round trip: under those locks a
	// tenant without a live lease has nothing in the journal that its
	// admissions rows and keys do not hold, so exact mode reads no journal.
	QueueJournalFind(b *pgx.Batch, ids, idTenants, tenants, keys []string, clock *time.Time)
	// ScanJournalFind reads what QueueJournalFind queued.
	ScanJournalFind(br pgx.BatchResults) ([]JournalHit, error)
	// BookLocked books a lease's journal under the row locks of its tree,
	// held by q (it locks the lease row, after them): the moves are its
	// admissions' reserve entries, each carrying its Admission and Key.
	BookLocked(ctx context.Context, q LockedQuerier, now time.Time, levels []Level, leaseID string) ([]LevelMove, error)
}

type leaseJournalBox struct{ j LeaseJournal }

// SetLeaseJournal registers the lease journal the store's decisions
// consult (budget/lease.New does it). Until then decisions read nothing
// of it: a store no lease was made on pays nothing for leasing.
func (s *Store) SetLeaseJournal(j LeaseJournal) {
	s.leaseJournal.Store(&leaseJournalBox{j: j})
}

func (s *Store) journal() LeaseJournal {
	if b := s.leaseJournal.Load(); b != nil {
		return b.j
	}
	return nil
}

// QueueKeyLock queues the advisory locks of (tenant, key) pairs
// (idempotency_key_lock.sql): the lease journal takes them before it reads
// and journals keys, as a decision does before it reads them (a decision
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

// keyLockRead takes the advisory locks of the reserves' keys, before they
// are read, when a lease journal is registered (then a key may be
// journaled without the tenant's lock), and only for the tenants with a
// live lease, decided in the statement, under the tenant rows' locks
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

// journalRead reads the lease journal rows the batch's requests name.
type journalRead struct {
	j     LeaseJournal
	byID  tenantKeys // (tenant, admission id)
	pairs tenantKeys
	clock *time.Time
	l     *loaded
}

func (r journalRead) queue(b *pgx.Batch) {
	r.j.QueueJournalFind(b, r.byID.keys, r.byID.tenants, r.pairs.tenants, r.pairs.keys, r.clock)
}

func (r journalRead) scan(br pgx.BatchResults) error {
	hits, err := r.j.ScanJournalFind(br)
	if err != nil {
		return fmt.Errorf("budget: lease journal: %w", err)
	}
	r.l.journal = hits
	return nil
}

// journalReads are the reads of the lease journal a batch needs, if a
// journal is registered: the key locks of its reserves, then the journal
// rows its settles and releases name and its reserves' keys.
func (s *Store) journalReads(w wants, clock *time.Time, l *loaded) (locks, find []read) {
	j := s.journal()
	if j == nil {
		return nil, nil
	}
	if len(w.idempotency.keys) > 0 {
		locks = append(locks, keyLockRead{pairs: w.idempotency})
	}
	var pairs tenantKeys
	pairs.tenants = append(append(pairs.tenants, w.namedBy.tenants...), w.idempotency.tenants...)
	pairs.keys = append(append(pairs.keys, w.namedBy.keys...), w.idempotency.keys...)
	if len(w.admissions) > 0 || len(pairs.keys) > 0 {
		find = append(find, journalRead{j: j, byID: w.byID, pairs: pairs, clock: clock, l: l})
	}
	return locks, find
}

// bookJournal applies, after the lock round trip, what the journal read
// found: a reserve's key the journal holds is its prior (a replay); an
// admission a settle or release names that is only in the journal has its
// lease booked here, in this transaction (reserve entries that move
// nothing, the admissions and key rows), and is then locked as if read.
func (s *Store) bookJournal(ctx context.Context, l *loaded, w wants) error {
	if len(l.journal) == 0 {
		return nil
	}
	reserveKey := map[[2]string]bool{}
	for i := range w.idempotency.keys {
		reserveKey[[2]string{w.idempotency.tenants[i], w.idempotency.keys[i]}] = true
	}
	ended := map[string]bool{}
	for _, id := range w.admissions {
		ended[id] = true
	}
	for i := range w.namedBy.keys {
		ended["\x00"+w.namedBy.tenants[i]+"\x00"+w.namedBy.keys[i]] = true
	}
	leases := map[string]string{} // lease -> tenant
	for _, h := range l.journal {
		pair := [2]string{h.TenantID, h.Key}
		if h.Key != "" && reserveKey[pair] && l.priors[pair] == nil {
			l.priors[pair] = &prior{admissionID: h.AdmissionID, hash: h.RequestHash, response: h.Response}
		}
		named := ended[h.AdmissionID] || h.Key != "" && ended["\x00"+h.TenantID+"\x00"+h.Key]
		if !h.Booked && named && l.tenants[h.TenantID] != nil {
			leases[h.LeaseID] = h.TenantID
		}
	}
	if len(leases) == 0 {
		return nil
	}
	ids := make([]string, 0, len(leases))
	for id := range leases {
		ids = append(ids, id)
	}
	sort.Strings(ids) // lease rows in id order, after the tenant rows
	if l.pre == nil {
		l.pre = &writes{}
	}
	for _, id := range ids {
		t := l.tenants[leases[id]]
		chain, err := chainOf(l.tenants, t)
		if err != nil {
			return err
		}
		levels, byID := levelsOf(chain, l.now)
		moves, err := s.journal().BookLocked(ctx, l.tx.conn, l.now, levels, id)
		if err != nil {
			return fmt.Errorf("budget: book lease %s: %w", id, err)
		}
		inserted := len(l.pre.inserted)
		if _, err := applyMoves(byID, moves, l.now, l.pre); err != nil {
			return err
		}
		for _, a := range l.pre.inserted[inserted:] {
			l.adms[a.ID] = a
		}
		for _, k := range l.pre.keys {
			l.named[[2]string{k.tenantID, k.key}] = k.admissionID
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
// sealed entry, and records in w the admissions and keys they carry. It
// returns the deltas applied.
func applyMoves(byID map[string]*tenant, moves []LevelMove, now time.Time, w *writes) ([]int64, error) {
	applied := make([]int64, len(moves))
	// A booked admission is an open reservation at every level, as a
	// reserve's debit counts it (its end frees the slot at each).
	booked := map[string]bool{}
	for _, m := range moves {
		if m.Admission != nil {
			booked[m.Admission.ID] = true
		}
	}
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
		if m.Kind == ledger.KindReserve && booked[m.Ref] {
			lv.Open++
		}
		e := lv.entry(m.Kind, now, actorOr(m.Actor, "lease"))
		e.DeltaMicro, e.AdmissionID, e.Model, e.Estimate, e.MoneyMicro = d, m.Ref, m.Model, m.Estimate, m.MoneyMicro
		e.Reason, e.Detail = m.Reason, m.Detail
		lv.seal(e)
		w.entry(lv, e)
		if m.Admission == nil {
			continue
		}
		// Booked: an admissions row as a reserve writes it. Its debit is
		// the lease's (the whole estimate at every level), so
		// debited_micro stays NULL and its end refunds or charges exactly
		// what an exact admission's would.
		a := *m.Admission
		a.State = StateReserved
		if a.TenantID == "" {
			a.TenantID = m.TenantID
		}
		if a.ExpiresAt.IsZero() {
			a.ExpiresAt = a.CreatedAt.Add(lv.Limits.ReservationTTL)
		}
		a.Face = a.Face.Or()
		w.inserted = append(w.inserted, &a)
		if k := m.Key; k != nil && k.Key != "" {
			resp, hash := k.Response, k.RequestHash
			if resp == nil {
				resp = []byte{} // NOT NULL: empty is "replay now"
			}
			if hash == nil {
				hash = []byte{}
			}
			w.keys = append(w.keys, keyPut{tenantID: a.TenantID, key: k.Key, admissionID: a.ID, hash: hash, response: resp, at: a.CreatedAt})
		}
	}
	return applied, nil
}
