package web

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admin"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
)

// Config configures a Dashboard. DB is required; nil or zero fields take
// defaults.
type Config struct {
	// SessionTTL is how long a login lasts. Defaults to 12 h.
	SessionTTL time.Duration
	// LoginFailuresPerMinute is how many failed logins one client address
	// may make per minute (also the burst); past it the login answers 429
	// without checking the token. Defaults to 10.
	LoginFailuresPerMinute int
}

// Dashboard serves the admin pages. Build it with New and add its routes to
// the API's router with Register.
type Dashboard struct {
	// admin is every page's and form's use case.
	admin *admin.Service
	// readsDown says why the reads that may lag (ledger pages, exports,
	// spend) go to the primary, "" while their pool is up
	// (replica.Replica.ReadsDown).
	readsDown func() string
	// lag is how far those reads are behind, nil without a reads pool.
	lag    *replica.Lag
	logger *slog.Logger
	ttl    time.Duration

	logins *credential.Limiter
	pages  map[string]*template.Template
	static map[string]staticFile
	origin *http.CrossOriginProtection
}

// New parses the embedded templates and returns a Dashboard on the
// replica's services: models are read and saved through its administration
// (admin.Service.Models), whose table is the one the admission use case
// estimates with, so that a model saved here applies in this replica at
// once (others follow within their refresh interval).
func New(rep *replica.Replica, cfg *Config) (*Dashboard, error) {
	if rep == nil {
		return nil, errors.New("web: a replica is required")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	d := &Dashboard{
		admin:     rep.Admin,
		readsDown: rep.ReadsDown,
		lag:       rep.Lag,
		logger:    rep.Logger,
		ttl:       cfg.SessionTTL,
		origin:    http.NewCrossOriginProtection(),
	}
	if d.ttl <= 0 {
		d.ttl = 12 * time.Hour
	}
	perMinute := cfg.LoginFailuresPerMinute
	if perMinute <= 0 {
		perMinute = 10
	}
	d.logins = credential.NewLimiter(float64(perMinute)/60, perMinute)
	var err error
	if d.static, err = loadStatic(); err != nil {
		return nil, err
	}
	if d.pages, err = d.parsePages(); err != nil {
		return nil, err
	}
	return d, nil
}

// Register adds the dashboard's routes to e. Each route carries the
// dashboard's middleware itself, so nothing changes for the API's routes
// (/v1, /healthz, /readyz, /metrics, /openapi.yaml).
func (d *Dashboard) Register(e *echo.Echo) {
	public := []echo.MiddlewareFunc{d.headers, d.htmlErrors, d.requireText}
	page := append(public[:len(public):len(public)], d.requireSession)
	change := append(public[:len(public):len(public)], d.sameOrigin, d.requireSession, d.checkCSRF)

	e.GET("/static/:name", d.serveStatic, d.headers)

	e.GET("/login", d.loginPage, public...)
	e.POST("/login", d.login, append(public[:len(public):len(public)], d.sameOrigin)...)
	e.POST("/logout", d.logout, change...)

	e.GET("/", d.overview, page...)
	e.POST("/tenants", d.tenantCreate, change...)
	e.GET("/tenants/:id", d.tenantShow, page...)
	e.POST("/tenants/:id/limits", d.tenantLimits, change...)
	e.POST("/tenants/:id/disable", d.tenantDisable, change...)
	e.POST("/tenants/:id/enable", d.tenantEnable, change...)
	e.POST("/tenants/:id/adjust", d.tenantAdjust, change...)
	e.POST("/tenants/:id/keys", d.keyCreate, change...)
	e.POST("/tenants/:id/keys/:key/revoke", d.keyRevoke, change...)
	e.POST("/tenants/:id/keys/:key/priority", d.keyPriority, change...)
	e.POST("/tenants/:id/keys/:key/models", d.keyModels, change...)
	e.POST("/tenants/:id/models", d.tenantModels, change...)
	e.POST("/tenants/:id/model-limits", d.modelLimitsSet, change...)
	e.POST("/tenants/:id/batch-allowance", d.batchAllowanceSet, change...)
	e.POST("/tenants/:id/lease", d.leaseModeSet, change...)
	e.POST("/tenants/:id/model-limits/remove", d.modelLimitsRemove, change...)

	e.GET("/models", d.models, page...)
	e.POST("/models", d.modelSave, change...)

	e.GET("/prices", d.pricesPage, page...)
	e.POST("/prices", d.priceAdd, change...)

	e.GET("/pools", d.poolsPage, page...)
	e.POST("/pools", d.poolCreate, change...)
	e.POST("/pools/:id/limits", d.poolSetLimits, change...)
	e.POST("/pools/:id/routes", d.poolRoute, change...)
	e.POST("/pools/:id/unroute", d.poolUnroute, change...)
	e.POST("/pools/:id/weights", d.poolWeight, change...)

	e.GET("/alerts", d.alertsPage, page...)
	e.POST("/alerts/endpoints", d.alertEndpointCreate, change...)
	e.POST("/alerts/endpoints/:id/rotate", d.alertEndpointRotate, change...)
	e.POST("/alerts/endpoints/:id/disable", d.alertEndpointDisable, change...)
	e.POST("/alerts/rules", d.alertRuleCreate, change...)
	e.POST("/alerts/rules/:id/delete", d.alertRuleDelete, change...)
	e.POST("/alerts/events/:id/redeliver", d.alertEventRedeliver, change...)

	e.GET("/ledger", d.ledgerPage, page...)
	e.GET("/ledger.csv", d.ledgerCSV, page...)

	e.GET("/ui/overview.json", d.liveOverview, d.headers, d.requireSessionJSON)

	// The address bar may hold a form's POST address (a refused form is
	// answered there); opening it again goes back to the form's page.
	e.GET("/logout", back("/"), public...)
	e.GET("/tenants", back("/"), public...)
	e.GET("/tenants/:id/:action", backToTenant, public...)
	e.GET("/tenants/:id/keys/:key/:action", backToTenant, public...)
	e.GET("/tenants/:id/model-limits/remove", backToTenant, public...)
	e.GET("/pools/:id/:action", back("/pools"), public...)
	e.GET("/alerts/:what", back("/alerts"), public...)
	e.GET("/alerts/:what/:id/:action", back("/alerts"), public...)
}

func back(to string) echo.HandlerFunc {
	return func(c *echo.Context) error { return seeOther(c, to) }
}

func backToTenant(c *echo.Context) error {
	return seeOther(c, "/tenants/"+pathEscape(c.Param("id")))
}

// postForm returns the POST body's fields (parsed at most once; never the
// query string's).
func postForm(c *echo.Context) url.Values {
	r := c.Request()
	if r.PostForm == nil {
		_ = r.ParseForm()
	}
	return r.PostForm
}

// csp allows nothing but this origin's files: no inline script or style
// (so an injected tag or attribute does nothing), no plugins, no framing,
// and forms post only here.
const csp = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// headers sets the security headers on every dashboard response, before
// the handler runs, so redirects and error pages carry them too.
func (d *Dashboard) headers(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c *echo.Context) error {
		h := c.Response().Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cache-Control", "no-store")
		return next(c)
	}
}

// sameOrigin refuses cross-origin POSTs (by Sec-Fetch-Site or Origin), a
// second lock besides the CSRF token and SameSite=Strict; it also covers
// the login form, which has no session yet.
func (d *Dashboard) sameOrigin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c *echo.Context) error {
		if err := d.origin.Check(c.Request()); err != nil {
			return pageErr(http.StatusForbidden, "This request came from another site, so it was refused.")
		}
		return next(c)
	}
}

// statusError is an expected failure shown to the admin as an error page.
type statusError struct {
	status  int
	message string
}

func (e *statusError) Error() string { return fmt.Sprintf("web: %d: %s", e.status, e.message) }

func pageErr(status int, message string) error { return &statusError{status, message} }

// htmlErrors renders the errors of dashboard handlers as HTML pages, so the
// API's JSON error handler never answers a browser. Unexpected errors are
// logged with the request id and shown without internals.
func (d *Dashboard) htmlErrors(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c *echo.Context) error {
		err := next(c)
		if err == nil {
			return nil
		}
		if r, _ := echo.UnwrapResponse(c.Response()); r != nil && r.Committed {
			d.logger.ErrorContext(c.Request().Context(), "dashboard response failed after it started",
				"error", err.Error(), "path", c.Path(), "request_id", c.Response().Header().Get(echo.HeaderXRequestID))
			return nil
		}
		status, message := http.StatusInternalServerError, "Something went wrong on the server. The error was logged."
		var se *statusError
		var he *echo.HTTPError
		switch {
		case errors.As(err, &se):
			status, message = se.status, se.message
		case errors.Is(err, rule.ErrTenantNotFound):
			status, message = http.StatusNotFound, "There is no tenant with that id."
		case errors.Is(err, rule.ErrPoolNotFound):
			status, message = http.StatusNotFound, "There is no pool with that id."
		case errors.As(err, &he) && he.Code < 500:
			status, message = he.Code, http.StatusText(he.Code)
		case account.IsInvalidInput(err):
			// A value the store refused: the admin's to correct, not an outage.
			status, message = http.StatusBadRequest, "A value of the form cannot be stored (a NUL character, a character outside UTF-8, or too long). Nothing was changed."
		case echo.StatusCode(err) >= 400 && echo.StatusCode(err) < 500:
			status, message = echo.StatusCode(err), http.StatusText(echo.StatusCode(err))
		default:
			d.logger.ErrorContext(c.Request().Context(), "dashboard request failed",
				"error", err.Error(), "method", c.Request().Method, "path", c.Path(),
				"request_id", c.Response().Header().Get(echo.HeaderXRequestID))
		}
		return d.render(c, status, "error.html", &errorView{
			layout:  layout{Title: http.StatusText(status), Session: sessionOf(c)},
			Status:  status,
			Message: message,
		})
	}
}

type errorView struct {
	layout
	Status  int
	Message string
}

// render executes a page into a buffer first, so a template error never
// sends half a page.
func (d *Dashboard) render(c *echo.Context, status int, name string, data any) error {
	t, ok := d.pages[name]
	if !ok {
		return fmt.Errorf("web: no page %s", name)
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", data); err != nil {
		return fmt.Errorf("web: render %s: %w", name, err)
	}
	return c.HTMLBlob(status, buf.Bytes())
}

// seeOther answers a successful POST with a redirect to a GET, so reloading
// the resulting page repeats nothing.
func seeOther(c *echo.Context, to string) error {
	return c.Redirect(http.StatusSeeOther, to)
}
