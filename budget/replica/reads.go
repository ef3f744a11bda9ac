package replica

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// Reads routes the reads that may lag (ledger pages and exports, drift
// and spend reports, the dashboard's tallies) to the reads pool
// (--read-database-url, a standby), and to the primary while that pool
// cannot be reached: a standby down must not take the ledger, the reports
// and the dashboard down with it (they answered 500, and an export 200
// with its header alone), and the primary can answer every one of them,
// fresher.
//
// The fallback is bounded so that a dead standby does not slow every
// page: the first read that finds it unreachable marks it down (it paid
// one connection attempt, at most the pool's connect timeout, 2 s with
// cmd's pools), and every read goes to the primary, without trying the
// standby, until the lag monitor's next successful reading of it (Lag.Check,
// every 2 s in serve) or, without one, for readsRetry. Only a failure to
// reach the standby falls back; an SQL error is the read's own.
//
// It is a ledger.Querier, as the pools are. Without a reads pool it is the
// primary.
type Reads struct {
	primary, standby *pgxpool.Pool // standby nil: no reads pool

	mu        sync.Mutex
	downUntil time.Time // the standby is skipped until then
	downErr   string    // why it was marked down
}

// readsRetry is how long a reads pool found unreachable is skipped when no
// lag reading says it is back: a read then tries it again, paying at most
// one connection attempt per period.
const readsRetry = 10 * time.Second

// NewReads routes reads to standby, or to primary while standby is down.
// A nil standby reads from primary alone.
func NewReads(primary, standby *pgxpool.Pool) *Reads {
	return &Reads{primary: primary, standby: standby}
}

// Query runs a read on the reads pool, or on the primary when that pool is
// down or fails to answer for want of a connection. A failure to reach the
// primary too wraps rule.ErrUnavailable (the faces answer 503).
//
// It reads the first row before it returns: a pooled connection whose
// server went away takes a statement it has prepared before, and its
// failure shows only at the first row (pgx reports it from Rows.Next),
// when it would be too late to read elsewhere.
func (r *Reads) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if r.standby != nil && !r.Down() {
		rows, err := firstRow(r.standby.Query(ctx, sql, args...))
		if err == nil {
			return rows, nil
		}
		if ctx.Err() != nil || !errors.Is(account.ReadError(err), rule.ErrUnavailable) {
			return nil, err // the caller went away, or the read itself failed
		}
		r.markDown(err)
	}
	rows, err := firstRow(r.primary.Query(ctx, sql, args...))
	if err != nil {
		return nil, account.ReadError(err)
	}
	return rows, nil
}

// firstRow reads the first row of rows, so that a failure to get it is
// Query's error, and returns rows that give that row first.
func firstRow(rows pgx.Rows, err error) (pgx.Rows, error) {
	if err != nil {
		return nil, err
	}
	has := rows.Next()
	if !has {
		if err := rows.Err(); err != nil {
			rows.Close()
			return nil, err
		}
	}
	return &peekedRows{Rows: rows, peeked: true, has: has}, nil
}

// peekedRows are rows whose first Next was called already: the next call
// returns its result without moving, and the row it read is the current
// one for Scan and Values.
type peekedRows struct {
	pgx.Rows
	peeked, has bool
}

func (p *peekedRows) Next() bool {
	if p.peeked {
		p.peeked = false
		return p.has
	}
	return p.Rows.Next()
}

// Down reports whether reads go to the primary because the reads pool
// could not be reached. Always false without a reads pool.
func (r *Reads) Down() bool {
	if r.standby == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return time.Now().Before(r.downUntil)
}

// DownReason is why the reads pool was last marked down ("" when it is up).
func (r *Reads) DownReason() string {
	if !r.Down() {
		return ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.downErr
}

// Standby is the reads pool, nil without one.
func (r *Reads) Standby() *pgxpool.Pool { return r.standby }

func (r *Reads) markDown(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.downUntil, r.downErr = time.Now().Add(readsRetry), err.Error()
}

// markUp sends reads to the reads pool again: the lag monitor reached it.
func (r *Reads) markUp() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.downUntil, r.downErr = time.Time{}, ""
}
