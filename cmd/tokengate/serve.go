// serve.go: the serve command, which builds one replica and hands it to
// every face (API, dashboard, proxy, rate limit service), and runs its
// background work.

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/tokengate/tokengate/api"
	"github.com/tokengate/tokengate/api/rls"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/outage"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/web"
)

type serveCmd struct {
	Addr               string        `name:"addr" env:"TOKENGATE_ADDR" default:":8080" help:"Address to listen on."`
	Migrate            bool          `name:"migrate" env:"TOKENGATE_MIGRATE" help:"Apply pending migrations before serving instead of refusing to start."`
	BodyLimit          int64         `name:"body-limit" env:"TOKENGATE_BODY_LIMIT" default:"${body_limit}" help:"Largest accepted request body, in bytes."`
	BodyReadTimeout    time.Duration `name:"body-read-timeout" env:"TOKENGATE_BODY_READ_TIMEOUT" default:"${body_read_timeout}" help:"Longest time a request body may take to arrive, from the end of its headers (API, dashboard, proxy): a slower body answers 408 and its connection is closed."`
	ShutdownTimeout    time.Duration `name:"shutdown-timeout" env:"TOKENGATE_SHUTDOWN_TIMEOUT" default:"15s" help:"How long shutdown waits for in-flight requests."`
	MaxConns           int32         `name:"max-conns" env:"TOKENGATE_MAX_CONNS" default:"32" help:"Largest number of database connections this replica opens."`
	SweepInterval      time.Duration `name:"sweep-interval" env:"TOKENGATE_SWEEP_INTERVAL" default:"5s" help:"How often this replica expires overdue reservations."`
	Pipelines          int           `name:"pipelines" env:"TOKENGATE_PIPELINES" default:"${pipelines}" help:"Decision transactions this replica keeps in flight at once; each decides every request queued for its share of the tenants in one transaction."`
	Gather             time.Duration `name:"gather" env:"TOKENGATE_GATHER" default:"${gather}" help:"How long a decision transaction may wait, after a busy one (8 requests or more), for the callers it answered to queue again, so that one transaction decides them all; at most that transaction's own duration. 0: never wait."`
	LeaseTTL           time.Duration `name:"lease-ttl" env:"TOKENGATE_LEASE_TTL" default:"${lease_ttl}" help:"Quota leasing (tenants in lease mode auto): a lease's life from its take or last renew, the longest a dead replica holds a tenant's budget. Leases are renewed every half of it."`
	LeaseOpenMax       int           `name:"lease-open-max" env:"TOKENGATE_LEASE_OPEN_MAX" default:"${lease_open_max}" help:"Quota leasing: how many of its open leased admissions a replica remembers (about 160 bytes each), to settle them in their lease's journal without locking the tenant; the settle of an older one is exact. 0: none."`
	LeaseSlice         int64         `name:"lease-slice" env:"TOKENGATE_LEASE_SLICE" default:"${lease_slice}" help:"Quota leasing: the smallest slice, in tokens, a replica leases of a tenant (its first, and a quiet tenant's); a busy tenant's slice is its rate over half the TTL, capped at its capacity over twice the replicas leasing it."`
	LeaseJournal       string        `name:"lease-journal" env:"TOKENGATE_LEASE_JOURNAL" default:"rows" enum:"rows,groups" help:"Quota leasing: how the journal stores leased admissions. rows: an admissions row each. groups: one row of arrays per group commit, which costs Postgres about half as much per admission (docs/leasing.md, \"The compact journal\"). Replicas of one database may differ."`
	MaxWaiters         int           `name:"max-waiters" env:"TOKENGATE_MAX_WAITERS" default:"${max_waiters}" help:"Callers of one tenant that may wait for tokens at once (max_wait_ms), per replica."`
	OnStoreUnavailable string        `name:"on-store-unavailable" env:"TOKENGATE_ON_STORE_UNAVAILABLE" enum:"reject,local" default:"reject" help:"Default failure policy when Postgres is unreachable (tenants and models may set their own)."`
	Replicas           int           `name:"replicas" env:"TOKENGATE_REPLICAS" default:"1" help:"Replicas running: under the local policy each admits 1/replicas of a tenant's limits."`
	ReplicaID          string        `name:"replica-id" env:"TOKENGATE_REPLICA_ID" help:"This replica's name in the ledger and its spool file (default: the host name)."`
	SpoolDir           string        `name:"spool-dir" env:"TOKENGATE_SPOOL_DIR" help:"Directory of the durable spool of local decisions; without it the local policy acts as reject."`
	TrustedProxies     []string      `name:"trusted-proxies" env:"TOKENGATE_TRUSTED_PROXIES" sep:"," help:"Proxies and gateways in front of this replica (CIDRs or addresses, comma-separated): from them, the client address is taken from X-Forwarded-For."`
	EstimateBytes      int64         `name:"estimate-bytes" env:"TOKENGATE_ESTIMATE_BYTES" help:"Most request body bytes this replica parses and estimates at once, on every face (API, proxy wires): past it a request waits its turn, then answers 503 estimator_busy. Default: 8 MiB per core, 16 to 64 MiB."`
	EstimateShare      int64         `name:"estimate-tenant-bytes" env:"TOKENGATE_ESTIMATE_TENANT_BYTES" help:"Most of --estimate-bytes one tenant may hold, so that one tenant's large bodies leave room for the others. Default: a quarter of --estimate-bytes."`
	EstimateWait       time.Duration `name:"estimate-wait" env:"TOKENGATE_ESTIMATE_WAIT" help:"Longest wait of a request for its turn to be estimated before it answers 503 estimator_busy. Default: --store-timeout."`
	StoreTimeout       time.Duration `name:"store-timeout" env:"TOKENGATE_STORE_TIMEOUT" default:"${store_timeout}" help:"Longest wait for Postgres per decision before the failure policy applies."`
	WatchInterval      time.Duration `name:"watch-interval" env:"TOKENGATE_WATCH_INTERVAL" default:"30s" help:"How often this replica checks every tenant's balance against its ledger."`
	RLSAddr            string        `name:"rls-addr" env:"TOKENGATE_RLS_ADDR" help:"Serve Envoy's rate limit service (gRPC) on this address, e.g. :8081. Off by default."`
	ProxyAddr          string        `name:"proxy-addr" env:"TOKENGATE_PROXY_ADDR" help:"Serve the OpenAI-compatible proxy on this address, e.g. :8082 (needs --upstream, --anthropic-upstream, --gemini-upstream or several). Off by default."`
	Upstream           string        `name:"upstream" env:"TOKENGATE_UPSTREAM" help:"The proxy's provider base URL, e.g. https://api.openai.com."`
	UpstreamKey        string        `name:"upstream-key" env:"TOKENGATE_UPSTREAM_KEY" help:"The proxy's bearer token for --upstream (tenants' keys never leave tokengate). Never logged."`
	AnthropicUpstream  string        `name:"anthropic-upstream" env:"TOKENGATE_ANTHROPIC_UPSTREAM" help:"The proxy's Anthropic base URL, e.g. https://api.anthropic.com: serves /v1/messages and /v1/messages/count_tokens."`
	AnthropicKey       string        `name:"anthropic-upstream-key" env:"TOKENGATE_ANTHROPIC_UPSTREAM_KEY" help:"The proxy's x-api-key for --anthropic-upstream (tenants' keys never leave tokengate). Never logged."`
	CountTokens        string        `name:"anthropic-count-tokens" env:"TOKENGATE_ANTHROPIC_COUNT_TOKENS" enum:"estimate,upstream" default:"estimate" help:"How the proxy answers /v1/messages/count_tokens: estimate (tokengate's estimator, no upstream call) or upstream (Anthropic's own count, the estimate when it cannot answer). Never a debit."`
	GeminiUpstream     string        `name:"gemini-upstream" env:"TOKENGATE_GEMINI_UPSTREAM" help:"The proxy's Gemini API base URL, e.g. https://generativelanguage.googleapis.com (or https://aiplatform.googleapis.com for Vertex AI with an API key): serves models/{model}:generateContent, :streamGenerateContent and :countTokens on AI Studio's and Vertex AI's paths."`
	GeminiKey          string        `name:"gemini-upstream-key" env:"TOKENGATE_GEMINI_UPSTREAM_KEY" help:"The proxy's x-goog-api-key for --gemini-upstream (tenants' keys never leave tokengate). Never logged."`
	GCPercent          int           `name:"gc-percent" env:"TOKENGATE_GC_PERCENT" default:"400" help:"Go's GOGC for the replica: the heap may grow this many percent over what is live before a collection (GOGC, when set, wins)."`
	MemoryLimit        int64         `name:"memory-limit" env:"TOKENGATE_MEMORY_LIMIT" default:"67108864" help:"A soft limit, in bytes, of the Go runtime's memory for the replica's work (default 64 MiB), over what it holds at start (the estimator's tables, about 45 MB): past it the collector runs more often; it never refuses memory (GOMEMLIMIT, when set, wins: then it is the whole limit); 0: none."`
	PprofAddr          string        `name:"pprof-addr" env:"TOKENGATE_PPROF_ADDR" help:"Serve Go's profiler (net/http/pprof) on this address, e.g. 127.0.0.1:6060. Off by default: it is for an operator on the host, never exposed."`
	// ClockOffset is a fault the soak injects (a replica's clock off the
	// database's): hidden, since it is for testing, not for operators.
	ClockOffset  time.Duration `name:"clock-offset" env:"TOKENGATE_CLOCK_OFFSET" hidden:"" help:"Testing only: moves this replica's own clock (the local failure policy's, and its lease holders') by this much."`
	Alerts       alertFlags    `embed:""`
	ModelRefresh time.Duration `name:"model-refresh" env:"TOKENGATE_MODEL_REFRESH" default:"5s" help:"How often this replica picks up model-table edits made elsewhere."`
}

func (s serveCmd) Run(ctx context.Context, g *globals) error {
	logger := g.logger()
	if err := estimator.Load(); err != nil {
		return err
	}
	// The soft limit is for the requests' work; the lease settle index is
	// a fixed budget beside it (its memory holds no pointer, so the
	// collector never scans it, but counted against the limit it would
	// make the collector run more often: 1.7x with the default index).
	limit := s.MemoryLimit
	if limit > 0 {
		limit += replica.LeaseOpenBytes(openMax(s.LeaseOpenMax))
	}
	tuneGC(s.GCPercent, limit)
	pool, err := g.pool(ctx, logger, s.MaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	reads, err := g.readPool(ctx, logger, max(4, s.MaxConns/4))
	if err != nil {
		return err
	}
	if reads != nil {
		defer reads.Close()
	}

	if s.Migrate {
		if err := migrate(ctx, pool, logger); err != nil {
			return err
		}
	} else if err := checkMigrations(ctx, pool); err != nil {
		return err
	}

	est := estimator.New(nil)
	refresh := &estimator.Refresh{Estimator: est, DB: pool}
	if err := refresh.Once(ctx); err != nil {
		return err
	}
	replicaID, err := s.replicaID()
	if err != nil {
		return err
	}
	alerts, err := s.Alerts.store(pool)
	if err != nil {
		return err
	}
	local, err := s.local(logger, replicaID)
	if err != nil {
		return err
	}
	if local != nil {
		local.ModelsFunc = est.Table
	}
	proxies, err := parseCIDRs(s.TrustedProxies)
	if err != nil {
		return fmt.Errorf("--trusted-proxies: %w", err)
	}
	// Tracing, only from the standard OTEL_ variables: off unless an OTLP
	// endpoint is set.
	tracing, err := replica.TracingFromEnv(ctx)
	if err != nil {
		return err
	}
	if tracing.On() {
		logger.Info("tracing on: exporting spans by OTLP (OTEL_ variables)")
		// The exporter's failures (a collector down) go to the log, not
		// to the standard logger.
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { logger.Warn("tracing", "error", err.Error()) }))
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tracing.Shutdown(sctx); err != nil {
				logger.Warn("tracing: the last spans could not be exported", "error", err.Error())
			}
		}()
	}
	// The replica's domain services, built once and handed to every face:
	// the HTTP API, the dashboard, the proxy and the rate limit service
	// admit through one admission layer and authenticate through one guard.
	rep, err := replica.New(replica.Config{
		DB: pool, Reads: reads, Logger: logger, Estimator: est, Alerts: alerts, Local: local,
		DefaultPolicy: rule.Policy(s.OnStoreUnavailable), StoreTimeout: s.StoreTimeout,
		MaxWaiters: s.MaxWaiters, Pipelines: s.Pipelines, Gather: gatherOf(s.Gather),
		Tracing: tracing, EstimateBytes: s.EstimateBytes, EstimateTenantBytes: s.EstimateShare, EstimateWait: s.EstimateWait,
		Leasing: replica.LeaseConfig{Holder: replicaID, TTL: s.LeaseTTL, MinSlice: s.LeaseSlice, OpenMax: openMax(s.LeaseOpenMax), NowFunc: s.clock(),
			JournalGroups: s.LeaseJournal == "groups"},
	})
	if err != nil {
		return err
	}
	defer rep.Close()
	srv, err := api.New(rep, &api.Config{
		BodyLimit:       s.BodyLimit,
		ShutdownTimeout: s.ShutdownTimeout,
		Timeouts:        s.httpTimeouts(),
		TrustedProxies:  proxies,
	})
	if err != nil {
		return err
	}
	defer srv.Close()
	dash, err := web.New(rep, nil)
	if err != nil {
		return err
	}
	dash.Register(srv.Echo())

	watch := &account.Watch{Store: rep.Store, Logger: logger, Alerts: alerts}
	rep.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tokengate_ledger_invariant_violations",
		Help: "Tenants whose stored balance or chain head disagreed with their ledger at the last check (should be 0).",
	}, func() float64 { return float64(watch.Violations()) }))

	// Background work of every replica, each on its own period: expiring
	// reservations, picking up model edits, adding rejection tallies to the
	// database, watching the ledger's invariants, and recovering from store
	// outages. It stops after the server has drained.
	bgCtx, stopBackground := context.WithCancel(context.Background())
	var bg errgroup.Group
	periodic := func(d time.Duration, what string, fn func(context.Context) error) {
		bg.Go(func() error { every(bgCtx, d, logger, what, fn); return nil })
	}
	periodic(s.SweepInterval, "expiry sweep", func(ctx context.Context) error {
		n, err := rep.Admitter.SweepOnce(ctx)
		if n > 0 {
			logger.Info("expired reservations", "count", n)
		}
		if err != nil {
			return err
		}
		// Batches still open past their completion window: refunded.
		n, err = rep.Batches.ExpireOverdue(ctx, 100)
		if n > 0 {
			logger.Info("expired batches", "count", n)
		}
		if err != nil {
			return err
		}
		// Batch file records past their retention: purged.
		n, err = rep.Batches.PurgeFiles(ctx, 1000)
		if n > 0 {
			logger.Info("purged batch files", "count", n)
		}
		return err
	})
	// Quota leasing: the journal's group commits, the sweep of expired
	// leases, the holders' renewals; at the end, every lease given back.
	bg.Go(func() error { rep.Leases.Run(bgCtx); return nil })
	periodic(s.ModelRefresh, "model refresh", refresh.Once)
	periodic(5*time.Second, "rejection tallies", rep.Rejections.Tick)
	periodic(s.WatchInterval, "ledger invariant watch", watch.Check)
	bg.Go(func() error { s.Alerts.run(bgCtx, alerts, replicaID, logger); return nil })
	periodic(500*time.Millisecond, "store recovery", func(ctx context.Context) error { rep.Admitter.RecoverOnce(ctx); return nil })
	if rep.Lag != nil {
		periodic(2*time.Second, "read replica lag", rep.Lag.Check)
	}
	defer func() {
		stopBackground()
		_ = bg.Wait()
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := rep.Rejections.Flush(fctx); err != nil { // the last tallies
			logger.Warn("flush rejection tallies", "error", err.Error())
		}
	}()

	if s.RLSAddr != "" {
		rlsLn, err := net.Listen("tcp", s.RLSAddr)
		if err != nil {
			return fmt.Errorf("--rls-addr %s: %w", s.RLSAddr, err)
		}
		gs := grpc.NewServer(rls.ServerOptions()...)
		rlsv3.RegisterRateLimitServiceServer(gs, rls.New(rep))
		go func() {
			if err := gs.Serve(rlsLn); err != nil {
				logger.Error("rate limit service stopped", "error", err.Error())
			}
		}()
		defer gs.GracefulStop()
		fmt.Fprintf(g.stderr, "tokengate rate limit service (gRPC) on %s\n", rlsLn.Addr())
	}
	if s.ProxyAddr != "" {
		stopProxy, err := s.serveProxy(g, rep, srv)
		if err != nil {
			return err
		}
		defer stopProxy()
	}
	if s.PprofAddr != "" {
		stopProfiler, err := serveProfiler(s.PprofAddr, logger)
		if err != nil {
			return err
		}
		defer stopProfiler()
	}

	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.Addr, err)
	}
	fmt.Fprintf(g.stderr, "tokengate listening on %s\n", displayURL(ln.Addr()))
	// The replica is cmd's: when serving ends, callers waiting for tokens
	// answer at once, on every face.
	stopWaiters := context.AfterFunc(ctx, rep.Admitter.Stop)
	defer stopWaiters()
	return srv.Serve(ctx, ln)
}

// replicaID is this replica's name: --replica-id, or the host name.
func (s serveCmd) replicaID() (string, error) {
	if s.ReplicaID != "" {
		return s.ReplicaID, nil
	}
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("replica id: %w", err)
	}
	return host, nil
}

// local opens the spool of the local failure policy, when configured.
func (s serveCmd) local(logger *slog.Logger, id string) (*outage.Local, error) {
	if s.SpoolDir == "" {
		if s.OnStoreUnavailable == string(rule.PolicyLocal) {
			logger.Warn("--on-store-unavailable=local needs --spool-dir; the local policy acts as reject")
		}
		return nil, nil
	}
	spool, err := outage.OpenSpool(s.SpoolDir, id)
	if err != nil {
		return nil, err
	}
	l := &outage.Local{Replicas: max(1, s.Replicas), Replica: id, Spool: spool, Logger: logger, NowFunc: s.clock()}
	if s.ClockOffset != 0 {
		logger.Warn("this replica's clock is moved (testing only)", "offset", s.ClockOffset.String())
	}
	return l, nil
}

// clock is this replica's own clock, moved by --clock-offset (nil, the
// default clock, without one): the local failure policy's and the lease
// holders'. The store's clock decides everything shared.
func (s serveCmd) clock() func() time.Time {
	if s.ClockOffset == 0 {
		return nil
	}
	offset := s.ClockOffset
	return func() time.Time { return time.Now().Add(offset) }
}

// gatherOf is --gather as the replica takes it: 0 on the command line
// means never wait, where the replica's zero means its default.
func gatherOf(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

// openMax is --lease-open-max as the replica takes it: 0 (none) is
// negative there, where 0 means the default.
func openMax(n int) int {
	if n <= 0 {
		return -1
	}
	return n
}
