package account

import (
	"context"
	_ "embed"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/rule"
)

var (
	//go:embed sql/rejections_add.sql
	rejectionsAddSQL string
	//go:embed sql/rejections_since.sql
	rejectionsSinceSQL string
	//go:embed sql/rejections_purge.sql
	rejectionsPurgeSQL string
)

// Rejections tallies rejected requests per tenant, minute and limit in
// memory, and adds the tallies to the database every few seconds: a
// rejection itself writes nothing, yet the dashboard sees every replica's
// throttling. It is safe for concurrent use.
type Rejections struct {
	pool   *pgxpool.Pool
	mu     sync.Mutex
	counts map[rejectionKey]int64
}

type rejectionKey struct {
	tenant string
	minute time.Time
	limit  rule.Limit
	shadow bool   // a shadow limit that would have refused (the request went on)
	window string // the window that refused (limit period_budget), "" for the others
}

// NewRejections returns a tally that flushes to pool.
func NewRejections(pool *pgxpool.Pool) *Rejections {
	return &Rejections{pool: pool, counts: map[rejectionKey]int64{}}
}

// Add counts one rejection, at the database time its decision was made.
func (r *Rejections) Add(rej *rule.RejectedError) {
	k := rejectionKey{tenant: rej.Snapshot.TenantID, minute: rej.Snapshot.At.Truncate(time.Minute), limit: rej.Limit, window: rej.Window}
	r.mu.Lock()
	r.counts[k]++
	r.mu.Unlock()
}

// AddShadow counts one request that the shadow limit l of tenant level
// would have refused, at the database time of its decision.
func (r *Rejections) AddShadow(level string, at time.Time, l rule.Limit) {
	k := rejectionKey{tenant: level, minute: at.Truncate(time.Minute), limit: l, shadow: true}
	r.mu.Lock()
	r.counts[k]++
	r.mu.Unlock()
}

// Flush adds the tallies gathered since the last flush to the database, in
// one round trip. Tallies that fail to write are kept for the next flush.
func (r *Rejections) Flush(ctx context.Context) error {
	r.mu.Lock()
	pending := r.counts
	r.counts = map[rejectionKey]int64{}
	r.mu.Unlock()
	if len(pending) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for k, n := range pending {
		b.Queue(rejectionsAddSQL, k.tenant, k.minute, string(k.limit), n, k.shadow, k.window)
	}
	if err := r.pool.SendBatch(ctx, b).Close(); err != nil {
		r.mu.Lock()
		for k, n := range pending {
			r.counts[k] += n
		}
		r.mu.Unlock()
		return fmt.Errorf("budget: flush rejections: %w", err)
	}
	return nil
}

// Tick flushes the tallies and purges those older than a day; the serve
// command runs it every few seconds, and Flush once more at shutdown.
func (r *Rejections) Tick(ctx context.Context) error {
	if err := r.Flush(ctx); err != nil {
		return err
	}
	if _, err := r.pool.Exec(ctx, rejectionsPurgeSQL); err != nil {
		return fmt.Errorf("budget: purge rejection tallies: %w", err)
	}
	return nil
}

// RejectionCount is the number of rejections of one tenant by one limit
// (and window) in one minute, across all replicas; with Shadow, the requests the shadow
// limit would have refused.
type RejectionCount struct {
	TenantID string
	Minute   time.Time
	Limit    rule.Limit
	Shadow   bool
	// Window is the window that refused (limit period_budget).
	Window string
	Count  int64
}

// RejectionsSince returns the flushed tallies of the minutes that overlap
// the last `window`, by the database's clock.
func (s *Store) RejectionsSince(ctx context.Context, window time.Duration) ([]RejectionCount, error) {
	rows, err := s.reads.Query(ctx, rejectionsSinceSQL, window.Seconds())
	if err != nil {
		return nil, fmt.Errorf("budget: rejections: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RejectionCount, error) {
		var c RejectionCount
		var limit string
		err := r.Scan(&c.TenantID, &c.Minute, &limit, &c.Shadow, &c.Window, &c.Count)
		c.Limit = rule.Limit(limit)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("budget: rejections: %w", err)
	}
	return out, nil
}
