// Package replica builds one tokengate replica's domain services, once:
// the store, the estimator, the admission layer, the credential guard, the
// alerts, the rejection tallies and the metrics registry. cmd builds a
// Replica and hands the same one to every face (the HTTP API, the
// dashboard, the OpenAI-compatible proxy, the Envoy rate limit service), so
// that every face admits through one admission layer, authenticates
// through one guard (one failed-authentication limiter, one key cache) and
// counts into one registry. A face translates; it never builds a domain
// service of its own.
package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/batch"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/outage"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/migrations"
)

// Config configures a Replica. Zero fields take defaults; DB is required.
type Config struct {
	// DB is the pool every replica shares state through. It belongs to
	// the caller.
	DB *pgxpool.Pool
	// Reads, when set, is a pool on a streaming replica (or one that may
	// fall back to the primary) for the reads that may lag: ledger
	// queries, exports, drift reports and the dashboard's tallies. The
	// decisions never read from it. It belongs to the caller. Nil: those
	// reads go to DB.
	Reads *pgxpool.Pool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registry collects the replica's metrics, served by the HTTP API at
	// /metrics. Defaults to a new registry with the Go and process
	// collectors.
	Registry *prometheus.Registry
	// Estimator estimates request costs. Defaults to the seeded model
	// table.
	Estimator *estimator.Estimator
	// Store decides admissions. Defaults to a account.Store on DB. Either
	// way it is given the Estimator's model table.
	Store *account.Store
	// Admissions is what the admission layer decides, sweeps and replays
	// through. Defaults to Store; tests wrap Store here to inject faults.
	Admissions admission.Store
	// Alerts manages alert endpoints, rules and events. Defaults to a
	// store on DB without a key (endpoints cannot be created).
	Alerts *alert.Store
	// Rejections tallies refusals for the dashboard and the throttled
	// alerts. Defaults to tallies on DB (the caller runs their Tick).
	Rejections *account.Rejections
	// Local decides under the local policy; nil makes local act as reject.
	Local *outage.Local
	// DefaultPolicy is the failure policy when neither the model nor the
	// tenant has one. Default reject.
	DefaultPolicy rule.Policy
	// StoreTimeout bounds how long a decision waits for its turn in this
	// replica, then each of its round trips, and a credential lookup.
	// Default account.DefaultStoreTimeout.
	StoreTimeout time.Duration
	// MaxWaiters bounds, per tenant, the callers waiting for tokens.
	// Default admission.DefaultMaxWaiters.
	MaxWaiters int
	// Pipelines is how many decision transactions the replica keeps in
	// flight at once. Default admission.DefaultPipelines.
	Pipelines int
	// Gather is how long a decision transaction may wait after a busy one
	// for its callers to come back. Zero: admission.DefaultGather;
	// negative: never wait.
	Gather time.Duration
	// AuthFailuresPerSecond and AuthFailureBurst size the failed
	// authentication limiter's buckets. Default 5 and 20.
	AuthFailuresPerSecond float64
	AuthFailureBurst      int
	// Tracing makes the admission layer's and the faces' spans
	// (TracingFromEnv). Nil: off. It belongs to the caller, who shuts it
	// down.
	Tracing *Tracing
	// EstimateBytes bounds the request body bytes the replica's faces
	// parse and estimate at once (EstimateGate); EstimateTenantBytes is
	// one tenant's share of them, EstimateWait how long a body waits for
	// its turn (default StoreTimeout: as long as a decision waits for
	// its turn). Zero fields take estimator.GateConfig's defaults.
	EstimateBytes, EstimateTenantBytes int64
	EstimateWait                       time.Duration
	// Leasing configures quota leasing (lease.go): the tenants in lease
	// mode auto are admitted from this replica's leases of their budget.
	Leasing LeaseConfig
}

// Replica is one replica's domain services. Its fields are set by New and
// shared by every face; they are safe for concurrent use. It exports no
// database pool: a face reads and changes state through the services
// (Admin for administration), never with SQL of its own.
type Replica struct {
	db *pgxpool.Pool
	// reads is where the reads that may lag go: Config.Reads, or DB
	// while it is down or when there is none (Reads).
	reads *Reads
	// schema checks that the database's schema is this binary's (Ready).
	schema *migrations.Migrator
	closed sync.Once
	// Lag measures how far Reads is behind DB: nil when Reads is DB. The
	// caller runs its Check periodically.
	Lag        *Lag
	Logger     *slog.Logger
	Registry   *prometheus.Registry
	Estimator  *estimator.Estimator
	Store      *account.Store
	Admitter   *admission.Admitter
	Guard      *credential.Guard
	Alerts     *alert.Store
	Rejections *account.Rejections
	// Admin is the administration: one method per admin operation, for the
	// API, the dashboard and the CLI alike.
	Admin *admin.Service
	// Tracing is Config.Tracing: the faces extract their callers' trace
	// context with it (nil: off; its methods are nil-safe).
	Tracing *Tracing
	// EstimateGate bounds the body bytes every face estimates at once:
	// a face takes a body's bytes before parsing it and gives them back
	// once it is estimated, answering estimator.ErrBusy past its wait.
	EstimateGate *estimator.Gate
	// Batches admits batch traffic against each tenant's enqueued-tokens
	// allowance; the caller's expiry sweep runs its ExpireOverdue.
	Batches *batch.Service
	// Leases is quota leasing: the caller runs its Run (the journal, the
	// sweeper, the holders' renewals) for as long as the replica serves.
	Leases *Leases
}

// New builds a replica's services. It starts nothing: the periodic work
// (expiry sweeps, store recovery, tallies, model refresh) is the caller's
// to run, on the Admitter, Rejections and Estimator.
func New(cfg Config) (*Replica, error) {
	if cfg.DB == nil {
		return nil, errors.New("replica: Config.DB is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
		cfg.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if cfg.Estimator == nil {
		cfg.Estimator = estimator.New(nil)
	}
	if cfg.Store == nil {
		cfg.Store = account.NewStore(cfg.DB)
	}
	var lag *Lag
	reads := NewReads(cfg.DB, cfg.Reads)
	if cfg.Reads != nil {
		cfg.Store.WithReads(reads)
		lag = NewLag(cfg.DB, cfg.Reads)
		lag.route = reads
		cfg.Registry.MustRegister(lag)
	}
	// The store bounds and prices settles with the table the replica
	// estimates with (admins change it at run time).
	cfg.Store.WithModels(cfg.Estimator.Table)
	if cfg.Alerts == nil {
		cfg.Alerts = alert.NewStore(cfg.DB, nil)
	}
	if cfg.Rejections == nil {
		cfg.Rejections = account.NewRejections(cfg.DB)
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = account.DefaultStoreTimeout
	}
	if cfg.Admissions == nil {
		cfg.Admissions = cfg.Store
	}
	est := cfg.Estimator
	leases, err := newLeases(cfg.Store, cfg.Leasing, cfg.Logger)
	if err != nil {
		return nil, err
	}
	registerJournal(cfg.Registry, leases.journal)
	adm := admission.New(admission.Config{
		Store: cfg.Admissions, Pool: cfg.DB, Local: cfg.Local, DefaultPolicy: cfg.DefaultPolicy,
		ModelPolicyFunc: func(family string) rule.Policy {
			m, _ := est.Table().Get(family)
			return rule.Policy(m.OnStoreUnavailable)
		},
		StoreTimeout: cfg.StoreTimeout, MaxWaiters: cfg.MaxWaiters, Pipelines: cfg.Pipelines,
		Gather: cfg.Gather, Logger: cfg.Logger, Registerer: cfg.Registry, Rejections: cfg.Rejections,
		TracerProvider: cfg.Tracing.TracerProvider(), Estimator: est, Leases: leases,
	})
	if cfg.EstimateWait <= 0 {
		cfg.EstimateWait = cfg.StoreTimeout
	}
	gate := estimator.NewGate(estimator.GateConfig{Bytes: cfg.EstimateBytes, TenantBytes: cfg.EstimateTenantBytes, Wait: cfg.EstimateWait})
	registerGate(cfg.Registry, gate)
	guard := credential.NewGuard(credential.GuardConfig{DB: cfg.DB, Health: adm,
		FailuresPerSecond: cfg.AuthFailuresPerSecond, Burst: cfg.AuthFailureBurst,
		LookupTimeout: cfg.StoreTimeout, Logger: cfg.Logger})
	batches, err := batch.New(batch.Config{Store: cfg.Store, Estimator: est})
	if err != nil {
		return nil, err
	}
	svc, err := admin.New(admin.Config{DB: cfg.DB, Reads: reads, Store: cfg.Store, Estimator: est, Alerts: cfg.Alerts, Logger: cfg.Logger, Batches: batches, Leases: leases.Store()})
	if err != nil {
		return nil, err
	}
	schema, err := migrations.New(cfg.DB, cfg.Logger)
	if err != nil {
		return nil, err
	}
	return &Replica{
		db: cfg.DB, reads: reads, schema: schema, Admin: svc, Lag: lag, Logger: cfg.Logger, Registry: cfg.Registry, Estimator: est, Store: cfg.Store,
		Admitter: adm, Guard: guard, Alerts: cfg.Alerts, Rejections: cfg.Rejections, Tracing: cfg.Tracing,
		EstimateGate: gate, Batches: batches, Leases: leases,
	}, nil
}

// registerJournal counts the lease journal's group commits by how they
// were written: a steady share of two round trips, or of stops, says the
// guards fire (leases ending, retries, credentials changing) more than the
// one round trip saves.
func registerJournal(reg prometheus.Registerer, j *lease.Journal) {
	way := func(name string, get func(lease.JournalStats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "tokengate_lease_journal_groups_total",
			Help:        "Lease journal group commits, by the way they were written: one_round_trip (sent whole, COMMIT included) or two_round_trips (read first, then written).",
			ConstLabels: prometheus.Labels{"way": name},
		}, func() float64 { return float64(get(j.Stats())) })
	}
	reg.MustRegister(
		way("one_round_trip", func(s lease.JournalStats) int64 { return s.OneRoundTrip }),
		way("two_round_trips", func(s lease.JournalStats) int64 { return s.TwoRoundTrips }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tokengate_lease_journal_stops_total",
			Help: "Lease journal groups sent in one round trip and rolled back by a guard (a lease that refused, a live Idempotency-Key, a credential changed) or a statement's error, then written in two.",
		}, func() float64 { return float64(j.Stats().Stopped) }),
	)
}

// registerGate counts the estimate gate in the replica's metrics.
func registerGate(reg prometheus.Registerer, g *estimator.Gate) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tokengate_estimator_bytes_in_use",
			Help: "Request body bytes being parsed and estimated now, on every face (at most tokengate_estimator_bytes_limit).",
		}, func() float64 { return float64(g.Stats().InUse) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tokengate_estimator_bytes_limit",
			Help: "The most request body bytes this replica parses and estimates at once (--estimate-bytes).",
		}, func() float64 { return float64(g.Config().Bytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tokengate_estimator_waits_total",
			Help: "Requests that waited for their turn to be estimated (the replica's or their tenant's bytes were taken).",
		}, func() float64 { return float64(g.Stats().Waits) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tokengate_estimator_refusals_total",
			Help: "Requests answered 503 estimator_busy: their turn to be estimated did not come within --estimate-wait.",
		}, func() float64 { return float64(g.Stats().Refusals) }),
	)
}

// Close waits for the guard's background writes and closes the store's
// probe connection and the schema check's handle. The pool belongs to the
// caller. Closing again does nothing.
func (r *Replica) Close() {
	r.closed.Do(func() {
		r.Guard.Close()
		r.Store.Close()
		_ = r.schema.Close()
	})
}

// ErrUnreachable: Ready could not reach the database.
var ErrUnreachable = errors.New("replica: database unreachable")

// Ready returns nil when this replica can make decisions: the database
// answers, its schema is the one this binary expects, and the admission
// layer is not stopped or degraded. Otherwise it returns ErrUnreachable,
// migrations.ErrPending, or the admission layer's reason.
func (r *Replica) Ready(ctx context.Context) error {
	if err := r.db.Ping(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	if err := r.schema.Check(ctx); err != nil {
		if errors.Is(err, migrations.ErrPending) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	return r.Admitter.Ready()
}

// ReadsDown returns why the pool of the reads that may lag is down (they go
// to the primary meanwhile), or "" while it is up or there is none.
func (r *Replica) ReadsDown() string { return r.reads.DownReason() }
