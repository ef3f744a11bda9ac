package api

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/estimator"
)

// DefaultBodyLimit bounds every request body: estimator.DefaultMaxRequestBytes.
const DefaultBodyLimit = estimator.DefaultMaxRequestBytes

// Config configures a Server's HTTP concerns; the domain services come
// from the replica (budget/replica). Zero fields take defaults.
type Config struct {
	// BodyLimit is the largest accepted request body, in bytes.
	BodyLimit int64
	// ShutdownTimeout bounds how long Serve waits for in-flight requests
	// after its context ends. Defaults to 15 s.
	ShutdownTimeout time.Duration
	// ReadyTimeout bounds the checks behind /readyz. Defaults to 2 s.
	ReadyTimeout time.Duration
	// TrustedProxies are the addresses of proxies and gateways in front of
	// the replica (CIDR ranges). From them, the client address used by the
	// failed-authentication limiter is the nearest address in
	// X-Forwarded-For that is not a trusted proxy. Empty: the TCP peer is
	// the client, and X-Forwarded-For is ignored (a client cannot pick its
	// own address to escape the limiter).
	TrustedProxies []*net.IPNet
	// Timeouts are the HTTP server's (Serve): header and body read
	// deadlines, idle keep-alive, draining of unread bodies. Zero fields
	// take the Default values of HTTPTimeouts.
	Timeouts HTTPTimeouts
}

// Server is one tokengate replica's HTTP server: a face of the replica.
type Server struct {
	echo     *echo.Echo
	logger   *slog.Logger
	registry *prometheus.Registry
	metrics  *httpMetrics
	cfg      Config
	// ready is the replica's readiness (replica.Replica.Ready).
	ready func(context.Context) error

	gate     *estimator.Gate // the replica's: bounds the bytes estimated at once
	admin    *admin.Service
	admitter *admission.Admitter
	guard    *credential.Guard
	tracing  *replica.Tracing // nil or off: no trace context is read
}

// New builds the router and its middleware on the replica's services. It
// does not listen; see Serve.
func New(rep *replica.Replica, cfg *Config) (*Server, error) {
	if rep == nil {
		return nil, fmt.Errorf("api: a replica is required")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.BodyLimit <= 0 {
		c.BodyLimit = DefaultBodyLimit
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 15 * time.Second
	}
	if c.ReadyTimeout <= 0 {
		c.ReadyTimeout = 2 * time.Second
	}
	s := &Server{
		logger:   rep.Logger,
		registry: rep.Registry,
		cfg:      c,
		ready:    rep.Ready,

		gate:     rep.EstimateGate,
		admin:    rep.Admin,
		admitter: rep.Admitter,
		guard:    rep.Guard,
		tracing:  rep.Tracing,
	}
	s.metrics = newHTTPMetrics(rep.Registry)
	s.metrics.traced = rep.Tracing.On()

	e := echo.NewWithConfig(echo.Config{Logger: rep.Logger})
	e.IPExtractor = echo.ExtractIPDirect()
	if len(c.TrustedProxies) > 0 {
		opts := []echo.TrustOption{echo.TrustLoopback(false), echo.TrustLinkLocal(false), echo.TrustPrivateNet(false)}
		for _, n := range c.TrustedProxies {
			opts = append(opts, echo.TrustIPRange(n))
		}
		e.IPExtractor = echo.ExtractIPFromXFFHeader(opts...)
	}
	e.HTTPErrorHandler = s.handleError
	if rep.Tracing.On() {
		// First, so that the latency's exemplar and the decision spans are
		// in the caller's trace.
		e.Use(s.traceContext)
	}
	e.Use(
		middleware.RequestID(),
		s.requestLogger(),
		s.metrics.middleware(),
		// A panic becomes an error: the error handler logs it with its stack
		// and answers a JSON 500 with no internals.
		middleware.RecoverWithConfig(middleware.RecoverConfig{StackSize: 8 << 10, DisableStackAll: true}),
		middleware.BodyLimit(c.BodyLimit),
	)
	s.echo = e
	s.routes()
	return s, nil
}

func (s *Server) routes() {
	s.echo.GET("/healthz", s.healthz)
	s.echo.GET("/readyz", s.readyz)
	s.echo.GET("/metrics", echo.WrapHandler(s.metricsHandler()))
	s.echo.GET("/openapi.yaml", func(c *echo.Context) error {
		return c.Blob(http.StatusOK, "application/yaml", OpenAPI)
	})

	// Admissions, settles and releases check the caller's key in their
	// decision's transaction; the other tenant routes look it up.
	decided := s.echo.Group("/v1", s.requireText, s.requireTenantForDecision, s.withRateHeaders)
	decided.POST("/admissions", s.createAdmission)
	decided.POST("/admissions/:id/settle", s.settleAdmission)
	decided.POST("/admissions/:id/release", s.releaseAdmission)
	v1 := s.echo.Group("/v1", s.requireText, s.requireTenant, s.withRateHeaders, knownQuery)
	v1.GET("/admissions/:id", s.getAdmission)
	v1.GET("/budget", s.getBudget)
	v1.POST("/estimate", s.postEstimate)
	v1.GET("/ledger", s.tenantLedger)

	admin := s.echo.Group("/v1/admin", s.requireText, s.requireAdmin, knownQuery)
	admin.GET("/tenants", s.adminTenantList)
	admin.POST("/tenants", s.adminTenantCreate)
	admin.GET("/tenants/:id", s.adminTenantGet)
	admin.GET("/tenants/:id/tree", s.adminTenantTree)
	admin.GET("/tenants/:id/batch-allowance", s.adminBatchAllowanceGet)
	admin.PUT("/tenants/:id/batch-allowance", s.adminBatchAllowancePut)
	admin.GET("/tenants/:id/model-limits", s.adminModelLimitsList)
	admin.PUT("/tenants/:id/model-limits", s.adminModelLimitsPut)
	admin.DELETE("/tenants/:id/model-limits", s.adminModelLimitsDelete)
	admin.PATCH("/tenants/:id/keys/:key", s.adminKeyPatch)
	admin.GET("/tenants/:id/models", s.adminTenantModelsGet)
	admin.PUT("/tenants/:id/models", s.adminTenantModelsPut)
	admin.PUT("/tenants/:id/end-user-policy", s.adminEndUserPolicyPut)
	admin.GET("/tenants/:id/end-user-policy", s.adminEndUserPolicyGet)
	admin.DELETE("/tenants/:id/end-user-policy", s.adminEndUserPolicyDelete)
	admin.GET("/tenants/:id/end-users", s.adminEndUserList)
	admin.POST("/alerts/endpoints", s.adminAlertEndpointCreate)
	admin.GET("/alerts/endpoints", s.adminAlertEndpointList)
	admin.POST("/alerts/endpoints/:endpoint/rotate", s.adminAlertEndpointRotate)
	admin.DELETE("/alerts/endpoints/:endpoint", s.adminAlertEndpointDisable)
	admin.POST("/alerts/rules", s.adminAlertRuleCreate)
	admin.GET("/alerts/rules", s.adminAlertRuleList)
	admin.DELETE("/alerts/rules/:rule", s.adminAlertRuleDelete)
	admin.GET("/alerts/events", s.adminAlertEventList)
	admin.POST("/alerts/events/:event/redeliver", s.adminAlertEventRedeliver)
	admin.GET("/pools", s.adminPoolList)
	admin.POST("/pools", s.adminPoolCreate)
	admin.PATCH("/pools/:pool/limits", s.adminPoolLimits)
	admin.PUT("/pools/:pool/models", s.adminPoolRoute)
	admin.DELETE("/pools/:pool/models", s.adminPoolUnroute)
	admin.PUT("/pools/:pool/weights/:id", s.adminPoolWeight)
	admin.PATCH("/tenants/:id/limits", s.adminTenantLimits)
	admin.GET("/tenants/:id/lease", s.adminTenantLeaseGet)
	admin.PUT("/tenants/:id/lease", s.adminTenantLeasePut)
	admin.POST("/tenants/:id/disable", s.adminTenantDisable)
	admin.POST("/tenants/:id/enable", s.adminTenantEnable)
	admin.POST("/tenants/:id/adjustments", s.adminTenantAdjust)
	admin.GET("/tenants/:id/keys", s.adminKeyList)
	admin.POST("/tenants/:id/keys", s.adminKeyCreate)
	admin.DELETE("/tenants/:id/keys/:key", s.adminKeyRevoke)
	admin.GET("/models", s.adminModelList)
	admin.POST("/models", s.adminModelCreate)
	admin.PATCH("/models/:name", s.adminModelUpdate)
	admin.GET("/prices", s.adminPriceList)
	admin.POST("/prices", s.adminPriceCreate)
	admin.GET("/prices/:model", s.adminPriceHistory)
	admin.GET("/ledger", s.adminLedger)
	admin.GET("/ledger/export", s.adminLedgerExport)
	admin.GET("/ledger/verify", s.adminLedgerVerify)
	admin.GET("/reports/drift", s.adminDriftReport)
	admin.GET("/tokens", s.adminTokenList)
	admin.DELETE("/tokens/:id", s.adminTokenRevoke)
}

// Echo exposes the router, for tests that add routes and for ServeHTTP.
func (s *Server) Echo() *echo.Echo { return s.echo }

// ServeHTTP makes the Server an http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.echo.ServeHTTP(w, r) }

// Serve serves HTTP on ln until ctx ends, then shuts down gracefully: it
// stops accepting connections and waits up to ShutdownTimeout for in-flight
// requests to finish.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	sc := echo.StartConfig{
		Listener:        ln,
		HideBanner:      true,
		HidePort:        true,
		GracefulTimeout: s.cfg.ShutdownTimeout,
		OnShutdownError: func(err error) {
			s.logger.Error("graceful shutdown did not finish in time", "error", err.Error())
		},
		BeforeServeFunc: func(hs *http.Server) error {
			s.cfg.Timeouts.Apply(hs)
			return nil
		},
	}
	s.logger.Info("serving", "address", ln.Addr().String())
	err := sc.Start(ctx, s.echo)
	s.logger.Info("stopped serving", "address", ln.Addr().String())
	return err
}

// Close releases what New opened: nothing today (the replica, which the
// Server only uses, belongs to the caller). It stays so callers need not
// change when the Server holds something of its own.
func (s *Server) Close() error { return nil }

// ClientAddr is the address a request comes from, read as the API reads it
// (through Config.TrustedProxies), for other HTTP faces to share.
func (s *Server) ClientAddr(r *http.Request) string { return s.echo.IPExtractor(r) }
