package alert

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// periodRulesExistSQL says whether any period_budget rule exists: budget
// reads it every few seconds (PeriodRules), and queues ThresholdsCrossedSQL
// only then.
const periodRulesExistSQL = `SELECT EXISTS (SELECT 1 FROM alert_rules WHERE kind = 'period_budget' AND deleted_at IS NULL)`

// PeriodRules is a replica's cache of whether any period_budget rule
// exists: without one, decisions queue no threshold statement (alerts cost
// nothing where there are none). It lives with the alert_rules table it
// caches; the store holds one and refreshes it before each decision's
// transaction. The zero value has read nothing, and says alerts are on.
type PeriodRules struct {
	read atomic.Pointer[periodRulesRead]
}

// periodRulesRead is one read of the rules, and when it was made.
type periodRulesRead struct {
	any bool
	at  time.Time
}

// Refresh reads, when the last read is older than ttl, whether any
// period_budget rule exists, through q. It returns the driver's error,
// for the caller to classify.
func (p *PeriodRules) Refresh(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, ttl time.Duration) error {
	if c := p.read.Load(); c != nil && time.Since(c.at) < ttl {
		return nil
	}
	var exists bool
	if err := q.QueryRow(ctx, periodRulesExistSQL).Scan(&exists); err != nil {
		return err
	}
	p.read.Store(&periodRulesRead{any: exists, at: time.Now()})
	return nil
}

// Note says a period_budget rule now exists, so that the next decision
// raises thresholds without waiting for a refresh.
func (p *PeriodRules) Note() { p.read.Store(nil) }

// On reports whether a decision must queue the threshold statement: yes
// unless a fresh read found no rule.
func (p *PeriodRules) On() bool {
	c := p.read.Load()
	return c == nil || c.any
}
