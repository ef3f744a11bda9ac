package lease

// Booking: a lease's journal rows become admissions (docs/leasing.md), by
// its renew, return or expiry (reconcile, under LockedLevels), or by a
// decision of the account store that ends one of them or meets its key
// (Store implements account.LeaseJournal).

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/ledger"
)

var (
	//go:embed sql/lease_unbooked.sql
	leaseUnbookedSQL string
	//go:embed sql/lease_admissions_find.sql
	leaseAdmissionsFindSQL string
)

var _ account.LeaseJournal = (*Store)(nil)

// QueueJournalFind queues the read of the journal rows named by admission
// id or by (tenant, key), of the tenants that have a live lease
// (lease_admissions_find.sql).
func (s *Store) QueueJournalFind(b *pgx.Batch, ids, idTenants, tenants, keys []string, clock *time.Time) {
	b.Queue(leaseAdmissionsFindSQL, ids, idTenants, tenants, keys, clock)
}

// ScanJournalFind reads what QueueJournalFind queued.
func (s *Store) ScanJournalFind(br pgx.BatchResults) ([]account.JournalHit, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	var out []account.JournalHit
	var h account.JournalHit
	var doc []byte
	_, err = pgx.ForEachRow(rows, []any{&h.LeaseID, &h.AdmissionID, &h.TenantID, &h.Key, &h.Booked, &doc}, func() error {
		var jd journaled
		if err := json.Unmarshal(doc, &jd); err != nil {
			return fmt.Errorf("decode %s: %w", h.AdmissionID, err)
		}
		h.RequestHash, h.Response = jd.RequestHash, jd.Response
		out = append(out, h)
		return nil
	})
	return out, err
}

// BookLocked books a lease's journal inside a decision that holds its
// tree's row locks (q), and returns the reserve entries of its rows, each
// carrying its admission. It takes no lock on the lease row: the rows it
// books are those committed (a group in flight is booked by the next
// booking), and the lease's state and expiry are not changed.
func (s *Store) BookLocked(ctx context.Context, q account.LockedQuerier, now time.Time, levels []account.Level, leaseID string) ([]account.LevelMove, error) {
	return s.reconcile(ctx, q, leaseID, levels, 0)
}

// bookChunk caps the journal rows one booking transaction outside a
// decision takes (Book), so that the tree's row locks are not held over a
// long backlog at once.
const bookChunk = 2000

// Book books a lease's committed journal into the ledger, in transactions
// of at most bookChunk rows under its tree's row locks, without locking
// the lease row: the lease's group commits go on meanwhile. It returns how
// many rows it booked.
func (s *Store) Book(ctx context.Context, leaseID string) (int, error) {
	tenantID, pending, err := s.tenantOf(ctx, leaseID)
	if err != nil || !pending {
		return 0, err
	}
	total := 0
	for {
		n := 0
		_, err := s.acct.LockedLevels(ctx, tenantID, func(ctx context.Context, q account.LockedQuerier, now time.Time, levels []account.Level) ([]account.LevelMove, error) {
			moves, err := s.reconcile(ctx, q, leaseID, levels, bookChunk)
			n = len(moves) / max(len(levels), 1)
			return moves, err
		})
		total += n
		if err != nil || n < bookChunk {
			return total, err
		}
	}
}

// reconcile takes, for booking, the lease's committed journal rows (up to
// limit; 0: all), deletes them, and returns, in the order journaled, a
// reserve entry at every level for each that moves nothing (the lease's
// take debited its cost), the one of the admission's own tenant carrying
// its admission (and key) to insert. Its caller holds the tree's row
// locks, so no other booking of the lease runs; with the lease row locked
// too (a return, an expiry, an admin change), no journal write is in
// flight and every row used counts is booked.
func (s *Store) reconcile(ctx context.Context, q account.LockedQuerier, leaseID string, levels []account.Level, limit int) ([]account.LevelMove, error) {
	lim := any(nil)
	if limit > 0 {
		lim = limit
	}
	rows, err := q.Query(ctx, leaseUnbookedSQL, leaseID, lim)
	if err != nil {
		return nil, fmt.Errorf("lease: journal: %w", err)
	}
	type jrow struct {
		seq             int64
		id, model, key  string
		cost, costMicro int64
		money           *int64
		at              time.Time
		doc             []byte
	}
	var js []jrow
	for rows.Next() {
		var j jrow
		if err := rows.Scan(&j.seq, &j.id, &j.model, &j.cost, &j.costMicro, &j.money, &j.at, &j.key, &j.doc); err != nil {
			rows.Close()
			return nil, fmt.Errorf("lease: journal: %w", err)
		}
		js = append(js, j)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("lease: journal: %w", err)
	}
	if len(js) == 0 {
		return nil, nil
	}
	slices.SortFunc(js, func(a, b jrow) int { return cmp.Compare(a.seq, b.seq) })
	moves := make([]account.LevelMove, 0, len(js)*len(levels))
	for _, j := range js {
		var jd journaled
		if err := json.Unmarshal(j.doc, &jd); err != nil {
			return nil, fmt.Errorf("lease: journal %s: %w", j.id, err)
		}
		adm := &jd.Admission
		if adm.ID == "" {
			adm = nil // journaled before its admission was: booked in the ledger only
		} else {
			adm.CreatedAt = j.at.UTC()
			if adm.TenantID == "" {
				adm.TenantID = levels[len(levels)-1].TenantID
			}
		}
		detail, _ := json.Marshal(struct {
			Lease       string `json:"lease"`
			CostMicro   int64  `json:"cost_micro"`
			JournaledAt string `json:"journaled_at"`
		}{leaseID, j.costMicro, j.at.UTC().Format(time.RFC3339Nano)})
		actor := jd.Actor
		if actor == "" {
			actor = "lease"
		}
		for _, lv := range levels {
			cost := j.cost
			m := account.LevelMove{TenantID: lv.TenantID, Kind: ledger.KindReserve, Ref: j.id, Model: j.model, Estimate: &cost, MoneyMicro: j.money, Actor: actor, Reason: "admitted from a lease", Detail: string(detail)}
			if adm != nil && lv.TenantID == adm.TenantID {
				m.Admission = adm
				if j.key != "" {
					m.Key = &account.AdmissionKey{Key: j.key, RequestHash: jd.RequestHash, Response: jd.Response}
				}
			}
			moves = append(moves, m)
		}
	}
	return moves, nil
}
