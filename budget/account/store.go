package account

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

var (
	//go:embed sql/tenant_lock.sql
	tenantLockSQL string
	//go:embed sql/tenant_get.sql
	tenantGetSQL string
	//go:embed sql/clock.sql
	clockSQL string
	//go:embed sql/clock_prices.sql
	clockPricesSQL string
	//go:embed sql/tenant_insert.sql
	tenantInsertSQL string
	//go:embed sql/admission_lock.sql
	admissionLockSQL string
	//go:embed sql/admission_get.sql
	admissionGetSQL string
	//go:embed sql/admission_expired_lock.sql
	admissionExpiredLockSQL string
	//go:embed sql/admission_expired_tenants.sql
	admissionExpiredTenantsSQL string
	//go:embed sql/admission_recent.sql
	admissionRecentSQL string
	//go:embed sql/key_live.sql
	keyLiveSQL string
	//go:embed sql/idempotency_get.sql
	idempotencyGetSQL string
	//go:embed sql/idempotency_purge.sql
	idempotencyPurgeSQL string
)

// Store decides admissions against the tenants' rows in Postgres. It is safe
// for concurrent use, and any number of replicas may share one database.
type Store struct {
	pool    *pgxpool.Pool
	nowFunc func() time.Time // nil: the database's clock
	// modelsFunc is the model table that bounds settles' usage (nil: the
	// seeded table), see WithModels.
	modelsFunc func() *estimator.Table

	// answered is when the store last answered a round trip of a decision
	// (unix nanoseconds). A request that ran out of time while the store
	// kept answering others waited its turn; it is not an outage.
	answered atomic.Int64

	routes atomic.Pointer[routeCache] // pool routes, see poolRoutes
	// leasing: leases may be journaled on this database (EnableLeasing).
	leasing atomic.Bool
	prices  atomic.Pointer[priceBook] // the price book, see priceBookFor
	// periodAlerts caches whether any period_budget alert rule exists,
	// see periodAlertRules.
	periodAlerts alert.PeriodRules
	// modelTenants are the tenants this replica saw with model limits at
	// some level of their tree (see modelQueue).
	modelTenants sync.Map
	// policyCache is this replica's copy of the end-user policies
	// (EndUserPolicyOf).
	policyCache
	// endUserSwept is when this replica last swept idle end users (unix
	// nanoseconds, endUserSweepDue).
	endUserSwept atomic.Int64

	// reads is where the reports read (Activity, DriftReport,
	// RejectionsSince): a replica's pool with WithReads, else pool. The
	// decisions never read from it.
	reads ledger.Querier

	pingMu sync.Mutex
	probe  *pgx.Conn // outside the pool, for Answering
	pingAt time.Time // the last ping, and its outcome
	pingOK bool
}

// NewStore returns a Store on pool.
func NewStore(pool *pgxpool.Pool) *Store {
	return &Store{pool: pool, reads: pool}
}

// WithReads makes the store's reports (Activity, DriftReport,
// RejectionsSince) read from reads, a pool on a streaming replica (or a
// router that falls back to the primary, replica.Reads), and returns the
// store: they scan the ledger and admissions over hours, which a replica
// can answer without taking the primary's CPU from decisions. Nothing a
// decision reads ever comes from it (a replica lags). nil keeps the store's
// own pool.
func (s *Store) WithReads(reads ledger.Querier) *Store {
	if reads != nil {
		s.reads = reads
	}
	return s
}

// WithClock makes the store decide at now() instead of the database's
// clock_timestamp(), and returns it. Tests freeze time with it instead of
// accepting ranges; production stores never set it, so that every replica
// decides on the one database clock.
func (s *Store) WithClock(now func() time.Time) *Store {
	s.nowFunc = now
	return s
}

// clock is the override passed to every query that reads the time ($n in
// coalesce($n::timestamptz, clock_timestamp())): nil unless WithClock.
func (s *Store) clock() *time.Time {
	if s.nowFunc == nil {
		return nil
	}
	t := s.nowFunc()
	return &t
}

// noteAnswer records that the store just answered a round trip.
func (s *Store) noteAnswer() { s.answered.Store(time.Now().UnixNano()) }

// AnsweredSince reports whether the store answered any decision's round
// trip after t.
func (s *Store) AnsweredSince(t time.Time) bool { return s.answered.Load() > t.UnixNano() }

// Answering tells a store that is merely busy from one that does not
// answer: true if it answered any decision's round trip after since, else
// whether a ping succeeds within a second on the store's probe connection,
// one of its own outside the pool (which may be exhausted), kept open so
// that the check costs one round trip, not a connection set-up that CPU
// contention can stretch. Concurrent callers share one ping.
func (s *Store) Answering(ctx context.Context, since time.Time) bool {
	if s.AnsweredSince(since) {
		return true
	}
	s.pingMu.Lock()
	defer s.pingMu.Unlock()
	if s.AnsweredSince(since) || (s.pingOK && s.pingAt.After(since)) {
		return true // answered while this caller waited for the ping
	}
	if !s.pingAt.IsZero() && s.pingAt.After(since) {
		return false // a ping since this request began found it silent
	}
	ok := s.ping(context.WithoutCancel(ctx))
	s.pingAt, s.pingOK = time.Now(), ok
	if ok {
		s.noteAnswer()
	}
	return ok
}

// ping pings on the probe connection, opening it first if need be. The
// caller holds pingMu.
func (s *Store) ping(ctx context.Context) bool {
	if s.probe == nil || s.probe.IsClosed() {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.ConnectConfig(cctx, s.pool.Config().ConnConfig.Copy())
		cancel()
		if err != nil {
			return false
		}
		s.probe = conn
	}
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	// A standby answers too: the probe asks whether this node takes
	// writes, so that a primary demoted by a failover, still up, is not
	// taken for a store that merely is busy.
	var standby bool
	if err := s.probe.QueryRow(pctx, "SELECT pg_is_in_recovery()").Scan(&standby); err != nil || standby {
		_ = s.probe.Close(context.Background())
		s.probe = nil
		return false
	}
	return true
}

// Close closes the probe connection. The pool belongs to the caller.
func (s *Store) Close() {
	s.pingMu.Lock()
	defer s.pingMu.Unlock()
	if s.probe != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.probe.Close(ctx)
		cancel()
		s.probe = nil
	}
}

// classify is the package's classify, told by the store's liveness: a
// request that timed out before COMMIT while the store answered others, or
// a ping, waited its turn too long (ErrBusy); nothing of it was committed.
// Only a store that answers nothing is ErrUnavailable.
func (s *Store) classify(ctx context.Context, err error, acquiring, committing bool, since time.Time) error {
	c := classify(err, acquiring, committing)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		s.noteAnswer() // an SQL error is an answer
	}
	timedOut := pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded)
	switch {
	case !timedOut || errors.Is(c, rule.ErrOutcomeUnknown):
		return c
	case errors.Is(c, rule.ErrBusy), errors.Is(c, rule.ErrUnavailable):
		if s.Answering(ctx, since) {
			if errors.Is(c, rule.ErrBusy) {
				return c
			}
			return fmt.Errorf("%w: waited its turn too long; the store answers: %v", rule.ErrBusy, err)
		}
		return fmt.Errorf("%w: the store answered nothing for %s: %v", rule.ErrUnavailable, time.Since(since).Round(time.Millisecond), err)
	}
	return c
}

// Pool is the store's pool, for reads of tables other packages own (the
// ledger) in tests and tools.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// QueueGenericPlans queues, after a BEGIN, the statement that has the
// rest of the transaction run on the plans cached on its connection (pgx
// prepares each statement once): a decision's transaction and a lease
// journal group both begin with it. Why: Postgres's default re-plans a
// statement on every use while its plan for the arguments looks cheaper
// than the generic one, and the tenant lock, the tenants' update, the
// lease use and the key locks looked so forever, at 50 to 115 µs of
// planning a transaction each (BENCHMARKS.md, "Quota leasing, third
// step"). Each statement that reads a table that grows is an index read
// as a generic plan (TestGenericPlansStayIndexed; the key reads look each
// key up on its own). A plan is costed on the statistics of its first
// use, so one made on an empty table lasts until autovacuum's first
// analyze (docs/operators.md, "Performance").
//
// The same statement turns sequential scans off for the transaction. A
// generic plan is costed without its arguments, so on a small tenants
// table (65 rows in the benches) the tenant lock, the tenants' update and
// the journal's insert (its join for the reservation TTL) each planned a
// scan of the whole table where they name a few rows by primary key; and
// the tenants table is where a scan costs most: its pages are kept a fifth
// full (00013) and every decision leaves a version of its rows there, so
// a scan reads many pages and every version in them. It cost 150 to 330
// µs a statement (BENCHMARKS.md, "Quota leasing, fourth step"). Every
// statement of these transactions reads rows it names through an index; a
// scan is still planned where no index can answer (the setting only
// prices it out), and TestGenericPlansStayIndexed holds each read to an
// index on a small table and on a large one. It also turns JIT
// compilation off: a scan priced out costs a plan more than JIT's
// threshold, and the price book's version (a table of one row, which only
// a scan reads) then compiled its plan on every execution: 120 ms a
// decision, a fifth of the rate on the first try. Nothing these
// transactions run is long enough for JIT to pay.
func QueueGenericPlans(b *pgx.Batch) {
	b.Queue(genericPlansSQL)
}

// genericPlansSQL is QueueGenericPlans's statement: its settings for the
// rest of the transaction, in one statement.
const genericPlansSQL = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true), " +
	"set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)"

// lockedTx is one decision's transaction on one connection, holding the
// tenant row lock from its first batch to its COMMIT.
type lockedTx struct {
	store *Store
	conn  *pgxpool.Conn
	open  bool
	// allowance is how long the lock phase was allowed (the caller's
	// deadline when it began); the write phase gets as long again.
	allowance time.Duration
	since     time.Time
	// priceVersion is the price book's version as the lock round trip read
	// it (prices.go).
	priceVersion int64
	// trips counts the round trips of a traced transaction (nil: not
	// traced; pipeline_trace.go), for the rollback, which runs on a
	// context of its own.
	trips *atomic.Int64
}

// lockTenants acquires a connection, begins a transaction and locks the
// tenants' rows (ids sorted, without duplicates), all in one statement in id
// order; after the locks it reads the database clock and runs the caller's
// extra reads, all in one round trip. Tenants that do not exist are absent
// from the map. The caller must call commit or abort.
func (s *Store) lockTenants(ctx context.Context, ids []string, extra func(*pgx.Batch), readExtra func(pgx.BatchResults) error) (*lockedTx, map[string]*tenant, time.Time, error) {
	start := time.Now()
	var allowance time.Duration
	if dl, ok := ctx.Deadline(); ok {
		allowance = dl.Sub(start)
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, time.Time{}, s.classify(ctx, fmt.Errorf("budget: acquire: %w", err), true, false, start)
	}
	tx := &lockedTx{store: s, conn: conn, open: true, allowance: allowance, since: start, trips: tripsOf(ctx)}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	QueueGenericPlans(b)
	b.Queue(tenantLockSQL, ids)
	b.Queue(clockPricesSQL, s.clock())
	if extra != nil {
		extra(b)
	}
	countTrip(ctx)
	br := conn.SendBatch(ctx, b)
	ts, now, err := func() (map[string]*tenant, time.Time, error) {
		for range 2 { // BEGIN, SET LOCAL
			if _, err := br.Exec(); err != nil {
				return nil, time.Time{}, fmt.Errorf("budget: begin: %w", err)
			}
		}
		ts, err := scanTenants(br.Query())
		if err != nil {
			return nil, time.Time{}, err
		}
		var now time.Time
		if err := br.QueryRow().Scan(&now, &tx.priceVersion); err != nil {
			return nil, time.Time{}, fmt.Errorf("budget: clock: %w", err)
		}
		if readExtra != nil {
			if err := readExtra(br); err != nil {
				return nil, time.Time{}, err
			}
		}
		return ts, now, nil
	}()
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("budget: lock batch: %w", cerr)
	}
	if err != nil {
		tx.abort()
		return nil, nil, time.Time{}, s.classify(ctx, err, false, false, start)
	}
	s.noteAnswer()
	return tx, ts, now, nil
}

// lockTenant is lockTenants for one tenant. It returns ErrTenantNotFound.
func (s *Store) lockTenant(ctx context.Context, tenantID string, extra func(*pgx.Batch), readExtra func(pgx.BatchResults) error) (*lockedTx, *tenant, time.Time, error) {
	tx, ts, now, err := s.lockTenants(ctx, []string{tenantID}, extra, readExtra)
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	t, ok := ts[tenantID]
	if !ok {
		tx.abort()
		return nil, nil, time.Time{}, rule.ErrTenantNotFound
	}
	return tx, t, now, nil
}

// abort rolls back and releases the connection. If the rollback cannot be
// sent, the pool discards the connection, and the server rolls back when it
// sees it close.
func (tx *lockedTx) abort() {
	if tx.conn == nil {
		return
	}
	if tx.open {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if tx.trips != nil {
			tx.trips.Add(1)
		}
		if _, err := tx.conn.Exec(ctx, "ROLLBACK"); err != nil {
			_ = tx.conn.Conn().Close(ctx)
		}
		cancel()
	}
	tx.conn.Release()
	tx.conn = nil
}
