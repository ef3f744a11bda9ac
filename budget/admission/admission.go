package admission

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/outage"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// Store is what the admission layer needs of the store: deciding batches
// (and telling busy from down, which *account.Store does), and applying what
// was decided without it.
type Store interface {
	account.Decider
	outage.Store
	TenantSnapshot(ctx context.Context, tenantID string) (rule.Snapshot, error)
	SweepOnce(ctx context.Context, expire account.ExpireFunc) (int, error)
	// End users (enduser.go).
	EndUserPolicyOf(ctx context.Context, tenantID string) (*account.EndUserPolicy, error)
	EndUserEnsure(ctx context.Context, parent, endUserID string) (string, error)
	EndUserAdmissionTenant(ctx context.Context, parent, admissionID string) (string, error)
}

// Config configures an Admitter. Zero fields take defaults; Store is
// required.
type Config struct {
	Store Store
	// Pool is the replica's pool: dropped when the store is found down (its
	// connections are likely dead too) and pinged by the recovery loop.
	Pool *pgxpool.Pool
	// Local decides under the local policy; nil makes local act as reject.
	Local *outage.Local
	// DefaultPolicy applies when neither the model nor the tenant has one.
	// Default reject.
	DefaultPolicy rule.Policy
	// ModelPolicyFunc returns a model family's failure policy ("" for
	// none). Nil: models have none.
	ModelPolicyFunc func(family string) rule.Policy
	// StoreTimeout bounds how long a decision waits for its turn, and then
	// each of its transaction's round trips. Default 3 s.
	StoreTimeout time.Duration
	// MaxWaiters bounds, per tenant, the callers waiting for tokens.
	// Default 64.
	MaxWaiters int
	// Pipelines is how many decision transactions the replica keeps in
	// flight at once (account.PipelineConfig.Shards). Default
	// DefaultPipelines.
	Pipelines int
	// Gather is how long a transaction may wait after a busy one for its
	// callers to come back (account.PipelineConfig.Gather). Zero:
	// DefaultGather; negative: never wait.
	Gather time.Duration
	Logger *slog.Logger
	// Registerer receives the layer's metrics. Nil registers none.
	Registerer prometheus.Registerer
	// Rejections tallies, for the dashboard, what shadow limits would have
	// refused. Nil tallies nothing (the metric still counts).
	Rejections *account.Rejections
	// Estimator is the replica's model table: it estimates and prices
	// what the faces parsed (Admit, Quote, CountOutput, SettleReported:
	// estimate.go), and resolves the model families of a gateway's Hits
	// (DecideHits). Nil: the seeded table estimates, and a model of Hits
	// is its own family.
	Estimator *estimator.Estimator
	// Leases is this replica's quota leasing (lease.go): a request of a
	// tenant in lease mode auto is admitted from the replica's lease of
	// it when no per-request rule keeps it exact. Nil: every request is
	// decided exactly.
	Leases Leases
	// TracerProvider makes the decision spans (trace.go) and the pipeline's
	// transaction spans, and puts exemplars on the latency. Nil: tracing
	// is off, and costs a nil check per decision.
	TracerProvider trace.TracerProvider
}

// DefaultPipelines is how many decision transactions a replica keeps in
// flight unless configured, each for its share of the tenants
// (account.PipelineConfig.Shards). One: everything queued while a
// transaction runs goes into the next, so batches are as large as the load
// makes them. A second transaction in flight halves every batch and puts
// two backends on the same index pages at once; measured on two cores
// with 64 tenants, it cost Postgres 1.5x to 1.9x the CPU per admission for
// no more admissions a second (BENCHMARKS.md, issue 23). More pipelines
// (--pipelines) keep one tenant's slow transaction, waiting on a row
// another replica holds, from holding up the tenants of the other shards,
// for a Postgres with cores to spare.
const DefaultPipelines = 1

// DefaultGather is how long a decision transaction may wait, after one of
// account.GatherFrom requests or more, for the callers it answered to queue
// again, unless configured (account.PipelineConfig.Gather): at most the
// answered transaction's own duration, and never under a light load.
// Measured with 32 callers over 64 tenants on two cores, it made batches of
// 16 into batches of 30 and cut Postgres's CPU per request by a quarter
// (BENCHMARKS.md, issue 23).
const DefaultGather = 2 * time.Millisecond

// DefaultMaxWaiters bounds, per tenant and replica, the callers waiting for
// tokens unless configured: past it a caller is refused at once.
const DefaultMaxWaiters = 64

// Admitter admits the requests of one replica. It is safe for concurrent
// use.
type Admitter struct {
	cfg      Config
	est      *estimator.Estimator // cfg.Estimator, else the seeded table's
	pipeline *account.Pipeline
	waiters  *waitQueues
	pools    *poolQueues
	logger   *slog.Logger
	tracer   trace.Tracer // nil: tracing is off

	down  atomic.Bool
	since atomic.Int64 // unix nanoseconds of the first failure
	snaps sync.Map     // tenant id -> the last rule.Snapshot seen

	endUsers endUserCache // (tenant, end user) -> the end user's tenant id

	// replayErr is the last spool replay's failure, nil once one succeeds:
	// Ready fails while decisions made without the store are not in it.
	replayErr atomic.Pointer[string]

	stopping chan struct{}
	stopOnce sync.Once

	storeUp    prometheus.Gauge
	replayFail prometheus.Counter
	shadow     *prometheus.CounterVec
	metrics    *metrics

	testSignals testSignals
}

// New returns an Admitter.
func New(cfg Config) *Admitter {
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = account.DefaultStoreTimeout
	}
	if cfg.MaxWaiters <= 0 {
		cfg.MaxWaiters = DefaultMaxWaiters
	}
	if cfg.Pipelines <= 0 {
		cfg.Pipelines = DefaultPipelines
	}
	if cfg.Gather == 0 {
		cfg.Gather = DefaultGather
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry() // unserved
	}
	est := cfg.Estimator
	if est == nil {
		est = estimator.New(nil)
	}
	a := &Admitter{
		cfg:      cfg,
		est:      est,
		tracer:   newTracer(cfg.TracerProvider),
		pipeline: account.NewPipeline(cfg.Store, &account.PipelineConfig{Timeout: cfg.StoreTimeout, Shards: cfg.Pipelines, Gather: cfg.Gather, Tracer: newPipeTracer(cfg.TracerProvider)}),
		waiters:  newWaitQueues(cfg.MaxWaiters, reg),
		pools:    newPoolQueues(),
		logger:   cfg.Logger,
		stopping: make(chan struct{}),
		storeUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tokengate_store_up",
			Help: "1 while this replica reaches the store, 0 while it decides by the failure policy.",
		}),
		replayFail: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokengate_spool_replay_failures_total",
			Help: "Replays of the local-policy spool that stopped before the end (the store went away again, or could not take a record); /readyz fails until one succeeds.",
		}),
	}
	a.shadow = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tokengate_shadow_refusals_total",
		Help: "Decisions a shadow limit would have refused (it refused nothing), by limit: what enforcing it would do.",
	}, []string{"limit"})
	a.storeUp.Set(1)
	reg.MustRegister(a.storeUp, a.replayFail, a.shadow)
	a.metrics = newMetrics(reg)
	a.metrics.traced = a.tracer != nil
	if cfg.Local != nil {
		spool := cfg.Local.Spool
		reg.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "tokengate_spool_rejected_records_total",
				Help: "Spool lines that could not be replayed (a torn tail cut off at start, an unreadable line, a record the store refused for good), kept in the spool's .rejected file.",
			}, func() float64 { return float64(spool.Rejected()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "tokengate_spool_bytes",
				Help: "Bytes of decisions made without the store that are waiting to be replayed into it.",
			}, func() float64 { n, _ := spool.Len(); return float64(n) }),
		)
		if n := spool.TornBytes(); n > 0 {
			a.logger.Error("SPOOL TORN TAIL: the last record of the spool was cut short by a crash before it was answered; it was cut off and kept in the rejected file",
				"bytes", n, "file", spool.RejectedPath())
		}
	}
	return a
}

// Stop ends every wait for tokens at once (each waiter gets its last
// rejection), so that a graceful shutdown is not held up by them.
func (a *Admitter) Stop() { a.stopOnce.Do(func() { close(a.stopping) }) }

// Down reports whether this replica treats the store as unreachable: it
// then decides by the failure policy without waiting on the store.
func (a *Admitter) Down() bool { return a.down.Load() }

// MarkDown records that the store did not answer. Requests stop trying it
// (each try would wait for a timeout) until the recovery loop reaches it.
func (a *Admitter) MarkDown(err error) {
	if a.down.CompareAndSwap(false, true) {
		a.since.Store(time.Now().UnixNano())
		a.logger.Error("store unavailable: deciding by the failure policy until it is back", "error", err.Error())
		a.storeUp.Set(0)
		if a.cfg.Pool != nil {
			// The pool's connections are likely dead too; drop them so none
			// is handed out once the store is back.
			a.cfg.Pool.Reset()
		}
	}
}

func (a *Admitter) remember(snap rule.Snapshot) {
	if snap.TenantID != "" {
		a.snaps.Store(snap.TenantID, snap)
	}
}

// wakeTree wakes the waiters of every tenant of the budget tree under
// root: what a reservation gave back at an ancestor may be what a sibling
// waits for.
func (a *Admitter) wakeTree(root string) {
	for _, id := range a.waiters.inTree(root) {
		a.waiters.wake(id)
	}
}

// LastSnapshot is the last snapshot of a tenant this replica saw.
func (a *Admitter) LastSnapshot(tenantID string) (rule.Snapshot, bool) {
	v, ok := a.snaps.Load(tenantID)
	if !ok {
		return rule.Snapshot{}, false
	}
	return v.(rule.Snapshot), true
}

// Snapshot is a tenant's limits and balances now; while the store is down,
// the last this replica saw (ok false if it saw none).
func (a *Admitter) Snapshot(ctx context.Context, tenantID string) (rule.Snapshot, error) {
	if a.Down() {
		if snap, ok := a.LastSnapshot(tenantID); ok {
			return snap, nil
		}
		return rule.Snapshot{}, rule.ErrUnavailable
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.StoreTimeout)
	defer cancel()
	snap, err := a.cfg.Store.TenantSnapshot(ctx, tenantID)
	if err == nil {
		a.remember(snap)
	}
	return snap, err
}

// policy resolves the failure policy of a request: the model's, else the
// tenant's (as this replica last saw it), else the replica's default.
func (a *Admitter) policy(family, tenantID string) rule.Policy {
	d := a.deferral(family)
	var tenant rule.Policy
	if snap, ok := a.LastSnapshot(tenantID); ok {
		tenant = snap.Limits.OnStoreUnavailable
	}
	return rule.ResolvePolicy(d.Model, tenant, d.Default)
}

// deferral is the failure policy of a request of a model family, but for
// its tenant's: the decision of a settle by key completes it with the
// tenant's own, read under the tenant's lock (account.Deferral).
func (a *Admitter) deferral(family string) *account.Deferral {
	d := &account.Deferral{Default: a.cfg.DefaultPolicy}
	if a.cfg.ModelPolicyFunc != nil {
		d.Model = a.cfg.ModelPolicyFunc(family)
	}
	return d
}
