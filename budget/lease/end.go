package lease

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/ledger"
)

var (
	//go:embed sql/lease_tree_lock.sql
	leaseTreeLockSQL string
	//go:embed sql/lease_gateway_lock.sql
	leaseGatewayLockSQL string
	//go:embed sql/lease_cut.sql
	leaseCutSQL string
)

// Ended is what EndLocked did to a tenant's live leases.
type Ended struct {
	// Returned are the leases of the tenant itself: reconciled and their
	// unused part refunded in the change's transaction.
	Returned []string
	// Cut are the leases of its descendants: made past their expiry in the
	// change's transaction (the journal refuses them at once), and ended
	// by EndCut after its commit, or by any sweeper.
	Cut []string
}

// EndLocked ends every live lease taken at the last of levels (a tenant
// whose tree the caller's transaction has locked: an account.LevelsFunc's
// arguments), so that an admin change that takes the tenant out of leasing
// (a disable, new limits or scope, lease mode off) applies to the next
// admission at once, not at the leases' TTL. The lease rows are locked
// after the tenant rows, so a journal group in flight commits first (and
// is booked here) and none runs until the change commits. The tenant's own
// leases are reconciled into the ledger and their unused parts refunded at
// every level (lease_return entries, state returned), in the change's
// transaction: it returns their moves for the caller to apply. A
// descendant's lease has levels this transaction did not lock, so it is
// only cut (its expiry set to now); EndCut ends it after the commit.
func (s *Store) EndLocked(ctx context.Context, q account.LockedQuerier, now time.Time, levels []account.Level) ([]account.LevelMove, Ended, error) {
	var ended Ended
	if len(levels) == 0 {
		return nil, ended, nil
	}
	tenantID := levels[len(levels)-1].TenantID
	rows, err := q.Query(ctx, leaseTreeLockSQL, tenantID)
	if err != nil {
		return nil, ended, fmt.Errorf("lease: lock leases of %s: %w", tenantID, err)
	}
	type live struct {
		id, tenant  string
		slice, used int64
		expiresAt   time.Time
	}
	var ls []live
	for rows.Next() {
		var l live
		if err := rows.Scan(&l.id, &l.tenant, &l.slice, &l.used, &l.expiresAt); err != nil {
			rows.Close()
			return nil, ended, fmt.Errorf("lease: lock leases of %s: %w", tenantID, err)
		}
		ls = append(ls, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, ended, fmt.Errorf("lease: lock leases of %s: %w", tenantID, err)
	}
	var moves []account.LevelMove
	for _, l := range ls {
		if l.tenant != tenantID {
			if _, err := q.Exec(ctx, leaseCutSQL, l.id, now); err != nil {
				return nil, ended, fmt.Errorf("lease: cut %s: %w", l.id, err)
			}
			ended.Cut = append(ended.Cut, l.id)
			continue
		}
		booked, err := s.reconcile(ctx, q, l.id, levels, 0, nil)
		if err != nil {
			return nil, ended, err
		}
		s.hints.forget(l.id) // (a lease left unknown is booked by the scan)
		moves = append(moves, booked...)
		if unused := l.slice - l.used; unused > 0 {
			moves = append(moves, s.moves(levels, ledger.KindLeaseReturn, l.id, unused, "end by an admin change")...)
		}
		if _, err := q.Exec(ctx, leaseEndSQL, l.id, "returned", now); err != nil {
			return nil, ended, fmt.Errorf("lease: end %s: %w", l.id, err)
		}
		ended.Returned = append(ended.Returned, l.id)
	}
	return moves, ended, nil
}

// EndCut ends the leases EndLocked cut, each under its own tree's locks
// (as a sweep does: state expired, its journal booked, the rest
// refunded). A lease already ended is skipped; what fails is left to the
// sweepers, which find it past its expiry.
func (s *Store) EndCut(ctx context.Context, ended Ended) error {
	var errs []error
	for _, id := range ended.Cut {
		if _, err := s.end(ctx, id, true); err != nil && !errors.Is(err, ErrOver) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// LockLive locks the live leases taken at a tenant's level (its own and
// its descendants'), in a transaction that holds the tenant's row lock: a
// change a journal group must see (a key revoked, or its model scope
// changed) then commits with no group of those leases in flight, and every
// group after it reads the change (the journal reads the keys after it
// locks its leases).
func (s *Store) LockLive(ctx context.Context, q account.LockedQuerier, tenantID string) error {
	rows, err := q.Query(ctx, leaseTreeLockSQL, tenantID)
	if err != nil {
		return fmt.Errorf("lease: lock leases of %s: %w", tenantID, err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("lease: lock leases of %s: %w", tenantID, err)
	}
	return nil
}

// LockLiveGateway locks the live leases a gateway credential of the given
// scope may admit through: its tenants' (the lease's tenant is the one a
// gateway names; a gateway's scope lists tenants, not trees), or every
// live lease when its scope is every tenant (rule.GatewayAllTenants). The
// gateway's revoke calls it after its write, in the same transaction: it
// then commits with no journal group of those leases in flight, and every
// group after it reads the gateway as revoked (the journal reads gateways
// after it locks its leases). It holds no tenant row lock: it takes lease
// rows only, by id as a group does, so it waits for groups, renews and
// returns but never forms a cycle with them.
func (s *Store) LockLiveGateway(ctx context.Context, q account.LockedQuerier, scope []string) error {
	rows, err := q.Query(ctx, leaseGatewayLockSQL, scope)
	if err != nil {
		return fmt.Errorf("lease: lock a gateway's leases: %w", err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("lease: lock a gateway's leases: %w", err)
	}
	return nil
}

// EndFunc is EndLocked as an account.LevelsFunc for an admin change's
// transaction; after the commit, the caller passes *ended to EndCut.
func (s *Store) EndFunc(ended *Ended) account.LevelsFunc {
	return func(ctx context.Context, q account.LockedQuerier, now time.Time, levels []account.Level) ([]account.LevelMove, error) {
		moves, e, err := s.EndLocked(ctx, q, now, levels)
		*ended = e
		return moves, err
	}
}
