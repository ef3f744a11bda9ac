package budget

import (
	"context"
	"fmt"
	"log/slog"
	"time"

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
		rows, err := s.pool.Query(ctx, admissionExpiredTenantsSQL, 100)
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
			func(b *pgx.Batch) { b.Queue(admissionExpiredLockSQL, tenantID, sweepBatch) },
			func(br pgx.BatchResults) error {
				rows, err := br.Query()
				if err != nil {
					return err
				}
				overdue, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Admission, error) { return scanAdmission(r) })
				return err
			})
		if err != nil {
			return total, fmt.Errorf("budget: sweep %s: %w", tenantID, err)
		}
		t.advance(now)
		b := &pgx.Batch{}
		n := t.expire(b, overdue, now)
		if n > 0 {
			first := &pgx.Batch{}
			t.queueUpdate(first)
			first.QueuedQueries = append(first.QueuedQueries, b.QueuedQueries...)
			b = first
		}
		if err := tx.finish(ctx, b); err != nil {
			return total, err
		}
		total += n
		if len(overdue) < sweepBatch {
			return total, nil
		}
	}
}

// Sweeper runs SweepOnce every Interval until its context ends.
type Sweeper struct {
	Store    *Store
	Interval time.Duration
	Logger   *slog.Logger
}

// Run sweeps until ctx ends. Errors are logged, not fatal: the next tick
// tries again.
func (w *Sweeper) Run(ctx context.Context) {
	interval := w.Interval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	logger := w.Logger
	if logger == nil {
		logger = slog.Default()
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		n, err := w.Store.SweepOnce(ctx)
		if err != nil && ctx.Err() == nil {
			logger.Error("expiry sweep failed", "error", err.Error())
		}
		if n > 0 {
			logger.Info("expired reservations", "count", n)
		}
	}
}
