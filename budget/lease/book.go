package lease

// Booking: the ledger entries of a lease's admissions (docs/leasing.md),
// written by its renew, return or expiry (reconcile, under LockedLevels),
// or by a decision of the account store that ends one of them
// (Store implements account.LeaseBooker). The admissions and key rows are
// the journal group commit's (journal.go): a booking only appends entries.

import (
	"context"
	"encoding/json"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

var _ account.LeaseBooker = (*Store)(nil)

// BookLocked books a lease's admissions inside a decision that holds its
// tree's row locks (q), and returns their reserve entries. It takes no
// lock on the lease row: the admissions it books are those committed (a
// group in flight is booked by the next booking), and the lease's state and
// expiry are not changed.
func (s *Store) BookLocked(ctx context.Context, q account.LockedQuerier, now time.Time, levels []account.Level, leaseID string) ([]account.LevelMove, error) {
	return s.reconcile(ctx, q, leaseID, levels, 0)
}

// bookChunk caps the admissions one booking transaction outside a
// decision takes (Book), so that the tree's row locks are not held over a
// long backlog at once.
const bookChunk = 2000

// Book books a lease's committed admissions into the ledger, in
// transactions of at most bookChunk under its tree's row locks, without
// locking the lease row: the lease's group commits go on meanwhile. It
// returns how many it booked.
func (s *Store) Book(ctx context.Context, leaseID string) (int, error) {
	tenantID, err := s.tenantOf(ctx, leaseID)
	if err != nil {
		return 0, err
	}
	if pending, err := s.acct.LeasePending(ctx, leaseID); err != nil || !pending {
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

// reconcile takes, for booking, the lease's committed admissions whose
// entries are still to write (up to limit; 0: all), moves its booking
// cursor past them, and returns, in the order journaled, a reserve entry at
// every level for each, which moves nothing (the lease's take debited its
// cost) and opens it there. Its caller holds the tree's row locks, so no
// other booking of the lease runs; with the lease row locked too (a return,
// an expiry, an admin change), no group commit is in flight and every
// admission the lease's use counts is booked.
func (s *Store) reconcile(ctx context.Context, q account.LockedQuerier, leaseID string, levels []account.Level, limit int) ([]account.LevelMove, error) {
	adms, err := account.LeasedToBook(ctx, q, leaseID, limit)
	if err != nil || len(adms) == 0 {
		return nil, err
	}
	moves := make([]account.LevelMove, 0, len(adms)*len(levels))
	for _, a := range adms {
		detail, _ := json.Marshal(struct {
			Lease       string `json:"lease"`
			CostMicro   int64  `json:"cost_micro"`
			JournaledAt string `json:"journaled_at"`
		}{leaseID, a.Cost * rule.Micro, a.CreatedAt.UTC().Format(time.RFC3339Nano)})
		actor := a.Actor
		if actor == "" {
			actor = "lease"
		}
		for _, lv := range levels {
			cost := a.Cost
			moves = append(moves, account.LevelMove{TenantID: lv.TenantID, Kind: ledger.KindReserve, Ref: a.ID, Model: a.Model,
				Estimate: &cost, MoneyMicro: a.MoneyMicro, Actor: actor, Reason: "admitted from a lease", Detail: string(detail), Opens: true})
		}
	}
	return moves, nil
}
