package lease

// Booking: the ledger entries of a lease's admissions (docs/leasing.md),
// written by its renew, return or expiry (reconcile, under LockedLevels),
// or by a decision of the account store that ends one of them (account
// books it there). The admissions and key rows are the journal group
// commit's (journal.go): a booking only appends entries.

import (
	"context"
	"time"

	"github.com/tokengate/tokengate/budget/account"
)

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
	// A lease this groups-shape store took is booked from the groups its
	// journal recorded (hints.go); any other is read from the store.
	hints, known := s.hints.of(leaseID)
	switch {
	case known && len(hints) == 0:
		return 0, nil
	case !known:
		if pending, err := s.acct.LeasePending(ctx, leaseID); err != nil || !pending {
			return 0, err
		}
	}
	var groups *account.LeaseGroups
	if known {
		groups = &account.LeaseGroups{}
		for _, g := range hints {
			groups.Add(g.holder, g.count)
		}
	}
	total := 0
	for {
		n := 0
		_, err := s.acct.LockedLevels(ctx, tenantID, func(ctx context.Context, q account.LockedQuerier, now time.Time, levels []account.Level) ([]account.LevelMove, error) {
			moves, err := s.reconcile(ctx, q, leaseID, levels, bookChunk, groups)
			n = len(moves) / max(len(levels), 1)
			return moves, err
		})
		total += n
		if err != nil {
			return total, err
		}
		if n < bookChunk {
			s.hints.drop(leaseID, len(hints))
			return total, nil
		}
	}
}

// reconcile takes, for booking, the lease's committed admissions whose
// entries are still to write (up to limit; 0: all), moves its booking
// cursor past them, and returns, in the order journaled, their entries
// (account.LeasedMoves: a reserve entry at every level for each, which
// moves nothing and opens it there). Its caller holds the tree's row locks, so no
// other booking of the lease runs; with the lease row locked too (a return,
// an expiry, an admin change), no group commit is in flight and every
// admission the lease's use counts is booked. groups: the group rows to read
// of a groups-shape journal (nil: its holder's groups above the cursor).
func (s *Store) reconcile(ctx context.Context, q account.LockedQuerier, leaseID string, levels []account.Level, limit int, groups *account.LeaseGroups) ([]account.LevelMove, error) {
	adms, err := account.LeasedToBook(ctx, q, leaseID, limit, groups)
	if err != nil || len(adms) == 0 {
		return nil, err
	}
	return account.LeasedMoves(levels, leaseID, adms), nil
}
