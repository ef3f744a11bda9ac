package admission

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokengate/tokengate/budget"
	"github.com/tokengate/tokengate/budget/outage"
	"github.com/tokengate/tokengate/budget/rule"
)

// Store is what the admission layer needs of the store: deciding batches
// (and telling busy from down, which *budget.Store does), and applying what
// was decided without it.
type Store interface {
	budget.Decider
	outage.Store
	TenantSnapshot(ctx context.Context, tenantID string) (rule.Snapshot, error)
	SweepOnce(ctx context.Context, expire budget.ExpireFunc) (int, error)
	// End users (enduser.go).
	EndUserPolicyOf(ctx context.Context, tenantID string) (*budget.EndUserPolicy, error)
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
	// flight at once (budget.PipelineConfig.Shards). Default
	// DefaultPipelines.
	Pipelines int
	// Gather is how long a transaction may wait after a busy one for its
	// callers to come back (budget.PipelineConfig.Gather). Zero:
	// DefaultGather; negative: never wait.
	Gather time.Duration
	Logger *slog.Logger
	// Registerer receives the layer's metrics. Nil registers none.
	Registerer prometheus.Registerer
	// Rejections tallies, for the dashboard, what shadow limits would have
	// refused. Nil tallies nothing (the metric still counts).
	Rejections *budget.Rejections
	// TracerProvider makes the decision spans (trace.go) and the pipeline's
	// transaction spans, and puts exemplars on the latency. Nil: tracing
	// is off, and costs a nil check per decision.
	TracerProvider trace.TracerProvider
}

// DefaultPipelines is how many decision transactions a replica keeps in
// flight unless configured, each for its share of the tenants
// (budget.PipelineConfig.Shards). One: everything queued while a
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
// budget.GatherFrom requests or more, for the callers it answered to queue
// again, unless configured (budget.PipelineConfig.Gather): at most the
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
	pipeline *budget.Pipeline
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
}

// New returns an Admitter.
func New(cfg Config) *Admitter {
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = budget.DefaultStoreTimeout
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
	a := &Admitter{
		cfg:      cfg,
		tracer:   newTracer(cfg.TracerProvider),
		pipeline: budget.NewPipeline(cfg.Store, &budget.PipelineConfig{Timeout: cfg.StoreTimeout, Shards: cfg.Pipelines, Gather: cfg.Gather, Tracer: newPipeTracer(cfg.TracerProvider)}),
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
	return budget.ResolvePolicy(d.Model, tenant, d.Default)
}

// deferral is the failure policy of a request of a model family, but for
// its tenant's: the decision of a settle by key completes it with the
// tenant's own, read under the tenant's lock (budget.Deferral).
func (a *Admitter) deferral(family string) *budget.Deferral {
	d := &budget.Deferral{Default: a.cfg.DefaultPolicy}
	if a.cfg.ModelPolicyFunc != nil {
		d.Model = a.cfg.ModelPolicyFunc(family)
	}
	return d
}

// Request is one admission to decide.
type Request struct {
	budget.ReserveParams
	// MaxWait is how long the caller will wait for tokens instead of a
	// rejection (capped by the tenant's max_wait).
	MaxWait time.Duration
	// Face is the front door the request came through: the admission's
	// owner (ReserveParams.Face is set from it: "" is the API), and the
	// metrics' label.
	Face Face
	// Start is when the face took the request, so that the latency
	// counts its estimation; zero means when Reserve was called.
	Start time.Time
	// Body is the request as its face received it (an HTTP body; for the
	// rate limit service, the descriptor that names the request). With an
	// IdempotencyKey and no RequestHash, its SHA-256 is the request's
	// fingerprint: a retry with the same key and body is answered with the
	// first admission, the key with another body is a mismatch.
	Body []byte
	// EndUser is what may name the caller's end user: when the tenant has
	// an end-user policy and the request gives an id from its source, the
	// request is decided as that end user (a leaf budget below the tenant,
	// with the tenant's key), and Reservation.Snapshot.TenantID is the end
	// user's tenant id, which its settle or release names.
	EndUser EndUser
}

// prepare applies the rules every face's request follows before it is
// decided: the idempotency key's form, and the request's fingerprint.
func (r *Request) prepare() error {
	if r.IdempotencyKey == "" {
		return nil
	}
	if problem := rule.IdempotencyKeyProblem(r.IdempotencyKey); problem != "" {
		return &rule.InvalidError{Field: "Idempotency-Key", Reason: problem}
	}
	if r.RequestHash == nil {
		h := sha256.Sum256(r.Body)
		r.RequestHash = h[:]
	}
	return nil
}

// Reserve decides a request through the store, or, when the store does not
// answer and the request's policy is local, against this replica's share
// (local is then true). It returns what budget.Store.Reserve returns, and
// rule.ErrUnavailable, ErrOutcomeUnknown or ErrBusy.
//
// Every outcome is counted here, by face: tokengate_admissions_total, and a
// rejection in the dashboard's tally, which the throttled alerts read.
func (a *Admitter) Reserve(ctx context.Context, req Request) (*budget.Reservation, bool, error) {
	start := req.Start
	if start.IsZero() {
		start = time.Now()
	}
	var span trace.Span
	if a.tracer != nil {
		ctx, span = a.tracer.Start(ctx, SpanAdmission, trace.WithTimestamp(start))
	}
	req.ReserveParams.Face = req.Face // the face that called, whatever the params say
	if err := req.prepare(); err != nil {
		a.Invalid(req.Face, start)
		if span != nil {
			endAdmissionSpan(span, &req, nil, false, OutcomeInvalid, "", err)
		}
		return nil, false, err
	}
	r, local, asEndUser, err := a.reserveEndUser(ctx, req)
	if !asEndUser {
		r, local, err = a.reserve(ctx, req)
	}
	if inv := (*rule.InvalidError)(nil); asEndUser && errors.As(err, &inv) {
		a.Invalid(req.Face, start) // the end-user id
		if span != nil {
			endAdmissionSpan(span, &req, nil, false, OutcomeInvalid, "", err)
		}
		return nil, false, err
	}
	outcome, limit := a.count(ctx, req.Face, start, r, err)
	if span != nil {
		endAdmissionSpan(span, &req, r, local, outcome, limit, err)
	}
	return r, local, err
}

func (a *Admitter) reserve(ctx context.Context, req Request) (r *budget.Reservation, local bool, err error) {
	p := req.ReserveParams
	if !a.Down() {
		r, err = a.reserveWaiting(ctx, p, req.MaxWait)
		if err == nil {
			a.remember(r.Snapshot)
			if !r.Replayed {
				a.recordShadow(r.Shadow, r.Snapshot.At)
			}
			return r, false, nil
		}
		var rej *rule.RejectedError
		if errors.As(err, &rej) {
			a.remember(rej.Snapshot)
			a.recordShadow(rej.Shadow, rej.Snapshot.At)
		}
		if !errors.Is(err, rule.ErrUnavailable) || errors.Is(err, rule.ErrOutcomeUnknown) {
			return nil, false, err
		}
		a.MarkDown(err)
	} else {
		err = rule.ErrUnavailable
	}
	if a.policy(p.Estimate.Family, p.TenantID) != rule.PolicyLocal || a.cfg.Local == nil {
		return nil, false, err
	}
	snap, ok := a.LastSnapshot(p.TenantID)
	if !ok {
		return nil, false, err // this replica never saw the tenant: it has no limits to apply
	}
	if len(snap.Path) > 0 {
		// A nested budget: this replica's share of the tenant alone cannot
		// bound what its organisation spends across every replica and
		// sibling, and overspending a parent is the failure tokengate
		// exists to prevent. The store decides, or no one does.
		return nil, false, err
	}
	r, err = a.cfg.Local.Reserve(snap, p)
	return r, true, err
}

// recordShadow counts what shadow limits would have refused of one
// request, from the decision that answered it (a caller that waited is
// counted once, like a rejection), so the count is what enforcing the
// limits would have refused.
func (a *Admitter) recordShadow(shadow []rule.ShadowRefusal, at time.Time) {
	for _, sr := range shadow {
		a.shadow.WithLabelValues(string(sr.Limit)).Inc()
		if a.cfg.Rejections != nil {
			a.cfg.Rejections.AddShadow(sr.Level, at, sr.Limit)
		}
	}
}

// Settle reconciles an admission (budget.Store.Settle), named by id or by
// idempotency key. While the store is down, the settle is journaled for the
// recovery loop as it was stated (its key, cached tokens or refund
// included; outage.Local.Settle) and journaled is true: the accounting is
// kept, the balance is not known yet.
//
// A settle by key that finds no admission while some replica may have
// made it on its own and not replayed it yet (the request's failure policy
// could be local: its model's, p.Family's, else its tenant's, else the
// replica's default) is kept in the store and applied when that admission
// is replayed: budget.ErrDeferred, which is an ErrAdmissionNotFound. A
// gateway's stream-end call is never retried, so answering it "not found"
// alone would lose its usage.
//
// Every outcome is counted here, by face: tokengate_settlements_total.
func (a *Admitter) Settle(ctx context.Context, face Face, p budget.SettleParams) (st *budget.Settlement, journaled bool, err error) {
	if a.tracer != nil {
		var span trace.Span
		ctx, span = a.tracer.Start(ctx, SpanSettle)
		tenantID := p.TenantID
		defer func() {
			endSettleSpan(span, face, tenantID, p.AdmissionID, st, journaled, a.metrics.outcomeOf(ctx, st, journaled, err), err)
		}()
	}
	p.Face = face // only the face that made the admission may end it
	if p.IdempotencyKey != "" && p.Defer == nil {
		p.Defer = a.deferral(p.Family)
	}
	if p.TenantID, err = a.endUserOfAdmission(ctx, p.TenantID, p.AdmissionID); err != nil {
		a.metrics.ended(ctx, face, kindSettle, nil, false, err)
		return nil, false, err
	}
	st, journaled, err = a.end(p.TenantID, p.AdmissionID,
		func() (*budget.Settlement, error) { return a.pipeline.Settle(ctx, p) },
		func(l *outage.Local) error { return l.Settle(p) })
	a.metrics.ended(ctx, face, kindSettle, st, journaled, err)
	return st, journaled, err
}

// Release refunds an admission whose request never ran, like Settle (one
// by key is kept the same way).
func (a *Admitter) Release(ctx context.Context, face Face, p budget.ReleaseParams) (st *budget.Settlement, journaled bool, err error) {
	if a.tracer != nil {
		var span trace.Span
		ctx, span = a.tracer.Start(ctx, SpanRelease)
		tenantID := p.TenantID
		defer func() {
			endSettleSpan(span, face, tenantID, p.AdmissionID, st, journaled, a.metrics.outcomeOf(ctx, st, journaled, err), err)
		}()
	}
	p.Face = face
	if p.IdempotencyKey != "" && p.Defer == nil {
		p.Defer = a.deferral(p.Family)
	}
	if p.TenantID, err = a.endUserOfAdmission(ctx, p.TenantID, p.AdmissionID); err != nil {
		a.metrics.ended(ctx, face, kindRelease, nil, false, err)
		return nil, false, err
	}
	st, journaled, err = a.end(p.TenantID, p.AdmissionID,
		func() (*budget.Settlement, error) { return a.pipeline.Release(ctx, p) },
		func(l *outage.Local) error { return l.Release(p) })
	a.metrics.ended(ctx, face, kindRelease, st, journaled, err)
	return st, journaled, err
}

// notReplayedWindow is how long after its making an unknown local
// admission is answered "not replayed yet" rather than "not found": a
// replica replays within seconds of reaching the store, and a day covers a
// replica down for long, and clocks that disagree.
const notReplayedWindow = 24 * time.Hour

// end decides a settle or release through the store, or, while the store
// is down, journals it. admissionID is "" for one named by idempotency key:
// a key the store does not know is not found, whether or not some replica
// admitted it on its own (only an id tells).
func (a *Admitter) end(tenantID, admissionID string, decide func() (*budget.Settlement, error),
	journal func(*outage.Local) error) (*budget.Settlement, bool, error) {
	if !a.Down() {
		st, err := decide()
		if err == nil {
			a.remember(st.Snapshot)
			if !st.Replayed {
				a.waiters.wake(tenantID) // a slot or tokens came free
				root := tenantID
				if len(st.Snapshot.Path) > 0 {
					root = st.Snapshot.Path[0]
				}
				a.wakeTree(root)
				if st.Admission != nil && st.Admission.PoolID != "" {
					a.pools.wake(st.Admission.PoolID)
				}
			}
			return st, false, nil
		}
		if errors.Is(err, rule.ErrAdmissionNotFound) {
			// Made by a replica on its own in an outage, and not replayed
			// yet (its replica may be replaying, or still cut off): the
			// caller should retry, not give the admission up as unknown.
			if at, local := budget.LocalAdmissionTime(admissionID); local && time.Since(at).Abs() < notReplayedWindow {
				return nil, false, fmt.Errorf("%w: %s", rule.ErrNotReplayed, admissionID)
			}
		}
		if !errors.Is(err, rule.ErrUnavailable) || errors.Is(err, rule.ErrOutcomeUnknown) {
			return nil, false, err
		}
		a.MarkDown(err)
	}
	if a.cfg.Local == nil {
		return nil, false, rule.ErrUnavailable
	}
	if err := journal(a.cfg.Local); err != nil {
		return nil, false, err
	}
	return nil, true, nil
}

// SweepOnce expires every overdue reservation, each tenant's expiry decided
// through the pipeline with that tenant's other requests. While the store
// is down it does nothing: expiry can wait for the store.
func (a *Admitter) SweepOnce(ctx context.Context) (int, error) {
	if a.Down() {
		return 0, nil
	}
	if a.tracer != nil {
		return a.cfg.Store.SweepOnce(ctx, a.expireTraced)
	}
	return a.cfg.Store.SweepOnce(ctx, a.pipeline.Expire)
}

// Ready reports why this replica should not get traffic: nil when its
// spool of decisions made without the store is replayed (or empty).
func (a *Admitter) Ready() error {
	if msg := a.replayErr.Load(); msg != nil {
		return fmt.Errorf("decisions made during the store outage could not be replayed yet: %s", *msg)
	}
	return nil
}

// RecoverOnce is one turn of the recovery loop, which every replica runs
// (every 500 ms): while the store is marked down or the spool holds
// decisions made without it, it pings the store; once the store answers,
// it replays the spool and lets requests use the store again.
func (a *Admitter) RecoverOnce(ctx context.Context) {
	pending := false
	if a.cfg.Local != nil {
		if n, err := a.cfg.Local.Spool.Len(); err == nil && n > 0 {
			pending = true
		}
	}
	if !a.Down() && !pending {
		return
	}
	if a.cfg.Pool != nil {
		pctx, cancel := context.WithTimeout(ctx, recoveryPingTimeout(a.cfg.Pool))
		err := a.cfg.Pool.Ping(pctx)
		cancel()
		if err != nil {
			return
		}
	}
	if pending {
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		rep, err := a.cfg.Local.Replay(rctx, a.cfg.Store)
		cancel()
		if err != nil {
			msg := err.Error()
			a.replayErr.Store(&msg)
			a.replayFail.Inc()
			a.logger.Error("replaying decisions made during the outage failed; retrying", "error", msg, "applied", rep.Reserved+rep.Ended,
				"spool", a.cfg.Local.Spool.Path())
			return
		}
		a.replayErr.Store(nil)
		a.logger.Info("replayed decisions made during the outage", "records", rep.Records, "admissions", rep.Reserved,
			"settles_and_releases", rep.Ended, "kept_for_another_replay", rep.Deferred, "already_applied", rep.Skipped, "rejected", rep.Rejected)
	}
	if a.down.CompareAndSwap(true, false) {
		a.logger.Info("store reachable again", "down_for", time.Since(time.Unix(0, a.since.Load())).Round(time.Millisecond).String())
		a.storeUp.Set(1)
	}
}

// recoveryPingTimeout bounds the recovery loop's ping: a second, plus a
// connect timeout for each host of a multi-host URL. After a failover the
// first hosts may be a killed primary, which costs a whole connect timeout
// before the next host is tried: a one-second ping would never reach the
// new primary behind it.
func recoveryPingTimeout(pool *pgxpool.Pool) time.Duration {
	cfg := pool.Config().ConnConfig
	return time.Second + cfg.ConnectTimeout*time.Duration(1+len(cfg.Fallbacks))
}
