package replica

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// Lag measures how far the reads pool (a streaming replica) is behind the
// primary, for the dashboard and /metrics: reads that lag are only as
// useful as an operator can see how stale they are. It is a
// prometheus.Collector.
type Lag struct {
	primary, reads *pgxpool.Pool
	// route, when set, is told whether the reads pool answered: a reading
	// that reaches it sends the reads back to it (Reads).
	route *Reads

	mu        sync.Mutex
	last      LagReading
	lastReset time.Time // when the reads pool was last made to choose again
}

// rechoose is how often, at most, a reads pool found on a primary drops
// its connections so that new ones choose again (moveToStandby).
const rechoose = 10 * time.Second

// LagReading is one measure of the reads pool.
type LagReading struct {
	// At is when it was taken; zero before the first Check.
	At time.Time
	// OK is false when the last Check failed (Err says why): the figures
	// are then those of the last success.
	OK  bool
	Err string
	// Standby says whether the reads went to a standby. False when they
	// went to the primary (a URL with target_session_attrs=prefer-standby
	// falls back to it): the lag is then 0.
	Standby bool
	// Seconds is the time since the standby replayed the last transaction
	// it received, when it has not replayed all the primary wrote (0 when
	// it has); Bytes is the WAL the primary wrote that the standby has not
	// replayed.
	Seconds float64
	Bytes   int64
}

// NewLag returns a Lag of reads behind primary.
func NewLag(primary, reads *pgxpool.Pool) *Lag {
	return &Lag{primary: primary, reads: reads}
}

// Check takes one reading. It returns the error that made it fail, which
// the reading also keeps.
func (l *Lag) Check(ctx context.Context) error {
	r, readsErr, err := l.read(ctx)
	if l.route != nil {
		switch {
		case readsErr == nil:
			l.route.markUp()
		case errors.Is(account.ReadError(readsErr), rule.ErrUnavailable):
			l.route.markDown(readsErr)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.last.At, l.last.OK, l.last.Err = time.Now(), false, err.Error()
		return err
	}
	l.last = r
	l.moveToStandby(r)
	return nil
}

// moveToStandby drops the reads pool's connections when they are on a
// primary though its URL names several hosts: after a failover that
// promoted the standby they were on, prefer-standby would otherwise keep
// them on the new primary for the connections' lifetime (it chooses only
// when a connection is made), and the reads would load the node that
// decides. New connections choose again: a standby if one answers, else
// the primary again, at most every rechoose. The caller holds mu.
func (l *Lag) moveToStandby(r LagReading) {
	if r.Standby || len(l.reads.Config().ConnConfig.Fallbacks) == 0 || time.Since(l.lastReset) < rechoose {
		return
	}
	l.lastReset = time.Now()
	l.reads.Reset()
}

// read takes a reading; readsErr is the reads pool's own failure (nil
// when it answered, though the primary may not have).
func (l *Lag) read(ctx context.Context) (r LagReading, readsErr, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r = LagReading{At: time.Now(), OK: true}
	var replayed string
	var secs float64
	err = l.reads.QueryRow(ctx, `SELECT pg_is_in_recovery(), coalesce(pg_last_wal_replay_lsn()::text, ''),
		CASE WHEN NOT pg_is_in_recovery() OR pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn() THEN 0
		     ELSE coalesce(extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp()), 0)::float8 END`).
		Scan(&r.Standby, &replayed, &secs)
	if err != nil {
		return r, err, fmt.Errorf("replica lag: the reads pool: %w", err)
	}
	if !r.Standby {
		return r, nil, nil
	}
	if err := l.primary.QueryRow(ctx, `SELECT greatest(pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn), 0)::bigint`, replayed).
		Scan(&r.Bytes); err != nil {
		return r, nil, fmt.Errorf("replica lag: the primary: %w", err)
	}
	if r.Bytes > 0 {
		r.Seconds = secs
	}
	return r, nil, nil
}

// Last is the last reading.
func (l *Lag) Last() LagReading {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last
}

var (
	lagSecondsDesc = prometheus.NewDesc("tokengate_read_replica_lag_seconds",
		"How long the reads pool's standby has been behind the primary (0 when it replayed everything; NaN before the first reading).", nil, nil)
	lagBytesDesc = prometheus.NewDesc("tokengate_read_replica_lag_bytes",
		"WAL the primary wrote that the reads pool's standby has not replayed.", nil, nil)
	lagStandbyDesc = prometheus.NewDesc("tokengate_read_replica_standby",
		"1 when the reads pool's connections go to a standby, 0 when to the primary.", nil, nil)
	lagUpDesc = prometheus.NewDesc("tokengate_read_replica_up",
		"1 when the last lag reading succeeded.", nil, nil)
	lagFallbackDesc = prometheus.NewDesc("tokengate_read_replica_fallback",
		"1 while the reads that may lag go to the primary because the reads pool cannot be reached.", nil, nil)
)

// Describe implements prometheus.Collector.
func (l *Lag) Describe(ch chan<- *prometheus.Desc) {
	ch <- lagSecondsDesc
	ch <- lagBytesDesc
	ch <- lagStandbyDesc
	ch <- lagUpDesc
	ch <- lagFallbackDesc
}

// Collect implements prometheus.Collector.
func (l *Lag) Collect(ch chan<- prometheus.Metric) {
	r := l.Last()
	secs, bytes := r.Seconds, float64(r.Bytes)
	if r.At.IsZero() {
		secs, bytes = math.NaN(), math.NaN()
	}
	ch <- prometheus.MustNewConstMetric(lagSecondsDesc, prometheus.GaugeValue, secs)
	ch <- prometheus.MustNewConstMetric(lagBytesDesc, prometheus.GaugeValue, bytes)
	ch <- prometheus.MustNewConstMetric(lagStandbyDesc, prometheus.GaugeValue, b2f(r.Standby))
	ch <- prometheus.MustNewConstMetric(lagUpDesc, prometheus.GaugeValue, b2f(r.OK))
	ch <- prometheus.MustNewConstMetric(lagFallbackDesc, prometheus.GaugeValue, b2f(l.route != nil && l.route.Down()))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
