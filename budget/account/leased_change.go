package account

import (
	"context"
	"fmt"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

// lockTree is lockTenant that keeps the locked rows (the tenant's and its
// ancestors'), so that an admin change can hand its tree to a LevelsFunc.
// It returns ErrTenantNotFound.
func (s *Store) lockTree(ctx context.Context, tenantID string) (*lockedTx, map[string]*tenant, *tenant, time.Time, error) {
	tx, ts, now, err := s.lockTenants(ctx, []string{tenantID}, nil, nil)
	if err != nil {
		return nil, nil, nil, time.Time{}, err
	}
	t, ok := ts[tenantID]
	if !ok {
		tx.abort()
		return nil, nil, nil, time.Time{}, rule.ErrTenantNotFound
	}
	return tx, ts, t, now, nil
}

// levelsIn runs fn, an admin change's LevelsFunc, in that change's
// transaction (tx, the rows of t's tree locked, the change already
// decided) and queues its moves on w as LockedLevels applies them: each
// level's balance moved (a refund capped at capacity, a debit never below
// zero) with its chained entry. budget/admin ends a tenant's leases so, in
// the transaction that disables it or changes its limits or scope, so that
// the journal refuses the next admission of its leases at once.
func levelsIn(ctx context.Context, tx *lockedTx, ts map[string]*tenant, t *tenant, now time.Time, fn LevelsFunc, w *writes) error {
	if fn == nil {
		return nil
	}
	chain, err := chainOf(ts, t)
	if err != nil {
		return err
	}
	// The same levels and moves as LockedLevels: a booked admission the
	// moves carry (a lease ended here reconciles its journal) is written
	// with its key like any booking.
	levels, byID := levelsOf(chain, now)
	moves, err := fn(ctx, tx.conn, now, levels)
	if err != nil {
		return err
	}
	if _, err := applyMoves(byID, moves, now, w); err != nil {
		return fmt.Errorf("budget: the levels of %s: %w", t.id, err)
	}
	return nil
}
