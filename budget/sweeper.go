package budget

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// SweepOnce expires every reservation whose expires_at has passed, tenant by
// tenant, and purges idempotency keys older than 24 h. Every replica may run
// it at once: each tenant is swept under its row lock, and overdue
// admissions are taken FOR UPDATE SKIP LOCKED. It returns how many
// reservations it expired.
func (s *Store) SweepOnce(ctx context.Context) (int, error) {
	total := 0
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
			n, err := s.sweepTenant(ctx, id)
			if err != nil {
				return total, err
			}
			progress += n
		}
		total += progress
		if len(tenants) < 100 || progress == 0 {
			break
		}
	}
	if _, err := s.pool.Exec(ctx, idempotencyPurgeSQL, 10000); err != nil {
		return total, fmt.Errorf("budget: purge idempotency keys: %w", err)
	}
	return total, nil
}

const sweepBatch = 500

func (s *Store) sweepTenant(ctx context.Context, tenantID string) (int, error) {
	total := 0
	for {
		var overdue []*Admission
		tx, t, now, err := s.lockTenant(ctx, tenantID,
			func(b *pgx.Batch) { b.Queue(admissionExpiredLockSQL, tenantID, sweepBatch, s.clock()) },
			func(br pgx.BatchResults) error {
				var err error
				overdue, err = scanAdmissions(br.Query())
				return err
			})
		if err != nil {
			return total, fmt.Errorf("budget: sweep %s: %w", tenantID, err)
		}
		t.advance(now)
		w := &writes{}
		n := t.expire(w, overdue, now)
		if err := tx.commit(ctx, w); err != nil {
			return total, err
		}
		total += n
		if len(overdue) < sweepBatch {
			return total, nil
		}
	}
}
