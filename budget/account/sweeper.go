package account

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ExpireFunc expires a tenant's overdue reservations (at most sweepBatch at
// a time) and says how many: Store.Expire, or a Pipeline's, which decides
// the expiry in a batch with the tenant's other requests.
type ExpireFunc func(ctx context.Context, tenantID string) (int, error)

// SweepOnce expires every reservation whose expires_at has passed, tenant by
// tenant, through expire (nil: Store.Expire), expires idle end users
// (EndUserExpireIdle, up to 1000, once every EndUserSweepEvery), and purges idempotency keys
// and kept settles (deferred.go) older than 24 h. Every replica may run it at once: each tenant's expiry
// holds its row lock, and overdue admissions are taken FOR UPDATE SKIP
// LOCKED. It returns how many reservations it expired.
func (s *Store) SweepOnce(ctx context.Context, expire ExpireFunc) (int, error) {
	if expire == nil {
		expire = s.Expire
	}
	total := 0
	// A groups-shape journal's overdue admissions are copied into
	// admissions first (group_copy.go), and expired below like any.
	for {
		n, err := s.CopyOverdueGroups(ctx, 100)
		if err != nil {
			return total, fmt.Errorf("budget: sweep: %w", err)
		}
		if n < 100 {
			break
		}
	}
	for {
		rows, err := s.pool.Query(ctx, admissionExpiredTenantsSQL, 100, s.clock())
		if err != nil {
			return total, fmt.Errorf("budget: sweep: %w", err)
		}
		tenants, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return total, fmt.Errorf("budget: sweep: %w", err)
		}
		progress := 0
		for _, id := range tenants {
			for {
				n, err := expire(ctx, id)
				if err != nil {
					return total, fmt.Errorf("budget: sweep %s: %w", id, err)
				}
				progress += n
				if n < sweepBatch {
					break
				}
			}
		}
		total += progress
		if len(tenants) < 100 || progress == 0 {
			break
		}
	}
	if s.endUserSweepDue() {
		if _, err := s.EndUserExpireIdle(ctx, 1000); err != nil {
			return total, fmt.Errorf("budget: sweep end users: %w", err)
		}
	}
	if _, err := s.pool.Exec(ctx, idempotencyPurgeSQL, 10000); err != nil {
		return total, fmt.Errorf("budget: purge idempotency keys: %w", err)
	}
	if _, err := s.pool.Exec(ctx, deferredSettlePurgeSQL, 10000); err != nil {
		return total, fmt.Errorf("budget: purge deferred settles: %w", err)
	}
	return total, nil
}

// sweepBatch bounds how many reservations of a tenant one transaction
// expires.
const sweepBatch = 500

// Expire expires up to sweepBatch of a tenant's overdue reservations in a
// transaction of its own, and says how many.
func (s *Store) Expire(ctx context.Context, tenantID string) (int, error) {
	r, err := s.decideOne(ctx, tenantID, Op{Expire: &ExpireParams{TenantID: tenantID}})
	return r.Expired, err
}
