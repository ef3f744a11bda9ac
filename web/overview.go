package web

import (
	"context"
	"errors"
	"math/big"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// sparkMinutes is how far back the per-minute sparklines reach.
const sparkMinutes = 15

// flashes are the messages a redirect may ask for with ?done=; the query
// picks one, it never supplies text.
var flashes = map[string]string{
	"created":     "Tenant created. Create a key for it below.",
	"limits":      "Limits saved. Every replica decides the next admission with them.",
	"disabled":    "Tenant disabled: its keys are refused until it is enabled again.",
	"enabled":     "Tenant enabled.",
	"adjusted":    "Adjustment recorded in the ledger.",
	"revoked":     "Key revoked. Requests with it are refused from now on.",
	"price_added": "Price added. It applies from its effective time on; earlier charges keep their price.",
	"saved":       "Model saved. This replica estimates with it now, the others within their refresh interval.",

	"model_limits":  "Model limits saved. Every replica decides the next admission of the model with them.",
	"model_removed": "Model limits removed: this tenant has no buckets of its own for the model any more.",
	"priority":      "Key priority changed. It orders this key's callers waiting for a pool from now on.",
	"models":        "Model scope saved. Every replica checks the next admission against it.",
	"pool_created":  "Pool created with a full bucket. Route a model to it so admissions draw on it.",
	"pool_limits":   "Pool limits saved.",
	"routed":        "Model routed: its admissions draw on the pool from now on.",
	"unrouted":      "Model unrouted: its admissions no longer draw on a pool.",
	"weight":        "Weight saved. The tenant's counter is kept.",

	"batch_allowance": "Batch allowance saved. New batches are reserved against it from now on; open ones keep what they hold.",
	"lease":           "Lease mode saved. Setting it off ended this tenant's live leases: every replica decides its next admission exactly.",
	"lease_exact":     "Lease mode saved, but a rule of this tenant's tree (a disable, an end user, a request, concurrency or model limit, windows, shadow limits or a model scope) keeps it in exact mode whatever its mode.",

	"endpoint_disabled": "Endpoint disabled: its rules raise nothing more, and its pending events are given up. Its log stays.",
	"rule_created":      "Rule created. It applies from the next decision on.",
	"rule_deleted":      "Rule deleted. Its events and their delivery log stay.",
	"redelivered":       "Event put back in the outbox: it is delivered again within seconds.",
}

func flash(c *echo.Context) string { return flashes[c.QueryParam("done")] }

// actor is who the ledger says made a change: the admin token's name.
func actor(c *echo.Context) string {
	if s := sessionOf(c); s != nil {
		return "admin:" + s.TokenName // as the admin API records it
	}
	return "admin"
}

// gauge is one bar of the overview: a balance against its limit.
type gauge struct {
	Name  string // data-gauge, as the live JSON names it
	Set   bool   // the limit is configured
	Text  string // "391 / 500"
	Pct   string // fill width in 0..100, one decimal
	Level string // ok, warn (amber) or bad (red)
	// Shadow marks a shadow limit: counted, never enforced.
	Shadow bool
}

// spark is a tenant's count per minute over the last sparkMinutes, oldest
// first, as SVG bar geometry.
type spark struct {
	Name string
	Bars []sparkBar
}

type sparkBar struct {
	X string `json:"x"`
	Y string `json:"y"`
	H string `json:"h"`
}

const (
	sparkBarWidth = 3
	sparkStep     = 4
	sparkHeight   = 20
)

// SparkWidth is the sparklines' viewBox width, for the templates.
func (spark) Width() int { return sparkMinutes * sparkStep }

// SparkHeight is the sparklines' viewBox height.
func (spark) Height() int { return sparkHeight }

// tenantRow is what the overview shows of a tenant; the page and the live
// JSON are both built from it, so they always agree.
type tenantRow struct {
	ID       string
	Disabled bool
	// Parent is the tenant's parent ("" for a root); Depth is its level
	// below the first row shown of its tree (treeOrder sets it).
	Parent string
	Depth  int
	// Current marks the tenant whose page this is, in its tree.
	Current bool
	// Status is throttled (a limit refused requests in the last two
	// minutes), low (a balance under 10 % or reservations near the cap),
	// ok or disabled.
	Status                                         string
	Tokens, Requests, Period, Open                 gauge
	Admitted, AdmittedPrev, Rejected, RejectedPrev int64
	// Why is the limit that refused most in the last two minutes, with
	// the window that refused for period_budget.
	Why       string
	WhyDetail string
	// PeriodWindow names the window Period shows, for a tenant without the
	// legacy period budget ("" for that budget, or none); PeriodHint
	// describes it (bound.go).
	PeriodWindow, PeriodHint string

	Spark [2]spark // admitted, rejected
	// Shadow lists the tenant's shadow limits; WouldRefuse says how many
	// requests each would have refused over the last sparkMinutes.
	Shadow      []string
	WouldRefuse string

	rank int
}

// Fields are the texts the live script replaces, keyed by data-field.
func (r *tenantRow) Fields() map[string]string {
	dash := func(g gauge) string {
		if !g.Set {
			return "—"
		}
		return g.Text
	}
	why := r.Why
	if why == "" {
		why = "—"
	}
	return map[string]string{
		"status":        r.Status,
		"tokens":        r.Tokens.Text,
		"requests":      dash(r.Requests),
		"period":        dash(r.Period),
		"open":          r.Open.Text,
		"admitted":      groupDigits(r.Admitted),
		"admitted_prev": groupDigits(r.AdmittedPrev),
		"rejected":      groupDigits(r.Rejected),
		"rejected_prev": groupDigits(r.RejectedPrev),
		"why":           why,
		"would_refuse":  r.WouldRefuse,
	}
}

// scaledLess says whether a*ma < b*mb, exactly for any int64s.
func scaledLess(a, ma, b, mb int64) bool {
	x := new(big.Int).Mul(big.NewInt(a), big.NewInt(ma))
	return x.Cmp(new(big.Int).Mul(big.NewInt(b), big.NewInt(mb))) < 0
}

func pct(part, whole int64) string {
	if whole <= 0 || part <= 0 {
		return "0"
	}
	if part >= whole {
		return "100"
	}
	// Tenths of a percent in integers: no float formatting surprises, and
	// no overflow of part * 1000 for any int64.
	tenths := new(big.Int).Quo(new(big.Int).Mul(big.NewInt(part), big.NewInt(1000)), big.NewInt(whole)).Int64()
	if part > 0 && tenths == 0 {
		tenths = 1 // a sliver, so a non-zero balance never looks empty
	}
	return strconv.FormatInt(tenths/10, 10) + "." + strconv.FormatInt(tenths%10, 10)
}

// balanceGauge shows what is left of a bucket or budget: amber under 10 %,
// red when nothing (or less) is left.
func balanceGauge(name string, left, capacity int64) gauge {
	g := gauge{Name: name, Set: true, Text: groupDigits(left) + " / " + groupDigits(capacity), Pct: pct(left, capacity), Level: "ok"}
	switch {
	case left <= 0:
		g.Level = "bad"
	case scaledLess(left, 10, capacity, 1):
		g.Level = "warn"
	}
	return g
}

func openGauge(open, maxOpen int64) gauge {
	if maxOpen <= 0 {
		return gauge{Name: "open", Text: groupDigits(open) + " open", Pct: "0", Level: "ok"}
	}
	g := gauge{Name: "open", Set: true, Text: groupDigits(open) + " / " + groupDigits(maxOpen), Pct: pct(open, maxOpen), Level: "ok"}
	switch {
	case open >= maxOpen:
		g.Level = "bad"
	case !scaledLess(open, 10, maxOpen, 8):
		g.Level = "warn"
	}
	return g
}

// limitOrder breaks ties of Why in the order limits are checked.
var limitOrder = []rule.Limit{rule.LimitTokens, rule.LimitRequests, rule.LimitConcurrency, rule.LimitPeriodBudget}

// tenantRows builds the rows of snaps with their activity per minute
// (account.Store.Activity), in tree order (treeOrder): throttled trees
// first. The current minute is the database's, taken from the snapshots.
func (d *Dashboard) tenantRows(ctx context.Context, snaps []rule.Snapshot) ([]*tenantRow, error) {
	if len(snaps) == 0 {
		return nil, nil
	}
	activity, err := d.admin.Activity(ctx, snaps[0].At, sparkMinutes)
	if err != nil {
		return nil, err
	}
	idle := &account.Activity{Admitted: make([]int64, sparkMinutes), Rejected: make([]int64, sparkMinutes)}
	currency, err := d.currencyFor(ctx, snaps)
	if err != nil {
		return nil, err
	}

	rows := make([]*tenantRow, 0, len(snaps))
	for _, s := range snaps {
		c, ok := activity[s.TenantID]
		if !ok {
			c = idle
		}
		l := s.Limits
		r := &tenantRow{
			ID:           s.TenantID,
			Disabled:     s.Disabled,
			Parent:       s.Parent(),
			Tokens:       balanceGauge("tokens", s.Tokens(), l.TokensCapacity),
			Requests:     gauge{Name: "requests", Pct: "0", Level: "ok"},
			Period:       gauge{Name: "period", Pct: "0", Level: "ok"},
			Open:         openGauge(s.OpenReservations, l.MaxConcurrent),
			Admitted:     c.Admitted[0],
			AdmittedPrev: c.Admitted[1],
			Rejected:     c.Rejected[0],
			RejectedPrev: c.Rejected[1],
			Spark:        [2]spark{sparkOf("admitted", c.Admitted), sparkOf("rejected", c.Rejected)},
		}
		if l.RequestsCapacity > 0 {
			r.Requests = balanceGauge("requests", s.Requests(), l.RequestsCapacity)
		}
		if l.PeriodBudget > 0 {
			r.Period = balanceGauge("period", s.PeriodRemaining(), l.PeriodBudget)
		}
		r.Shadow = l.Shadow.Strings()
		r.WouldRefuse = wouldRefuse(l.Shadow, c.WouldRefuse)
		for _, g := range []*gauge{&r.Tokens, &r.Requests, &r.Period, &r.Open} {
			g.Shadow = l.Shadow.Has(gaugeLimit[g.Name])
		}
		var detail []string
		var best int64
		bound := boundWindow(c.ByWindow)
		for _, lim := range limitOrder {
			if n := c.ByLimit[lim]; n > 0 {
				named := string(lim)
				if lim == rule.LimitPeriodBudget && bound != "" {
					named += " (window " + bound + ")"
				}
				detail = append(detail, named+" "+groupDigits(n))
				if n > best {
					best, r.Why = n, named
				}
			}
		}
		r.windowGauge(s, bound, currency)
		if len(detail) > 0 {
			r.WhyDetail = "refused in the last 2 minutes: " + strings.Join(detail, ", ")
		}
		switch {
		case s.Disabled:
			r.Status, r.rank = "disabled", 3
		case r.Rejected+r.RejectedPrev > 0:
			r.Status, r.rank = "throttled", 0
		case r.Tokens.Level != "ok" || r.Requests.Level != "ok" || r.Period.Level != "ok" || r.Open.Level != "ok":
			r.Status, r.rank = "low", 1
		default:
			r.Status, r.rank = "ok", 2
		}
		rows = append(rows, r)
	}
	return treeOrder(rows), nil
}

// sparkOf lays out counts (index 0 is the current minute) as bars, oldest
// on the left, scaled to the largest.
func sparkOf(name string, counts []int64) spark {
	var top int64
	for _, n := range counts {
		top = max(top, n)
	}
	s := spark{Name: name, Bars: make([]sparkBar, sparkMinutes)}
	for i := range sparkMinutes {
		n := counts[sparkMinutes-1-i]
		h := int64(0)
		if top > 0 && n > 0 {
			h = max(1, n*sparkHeight/top)
		}
		s.Bars[i] = sparkBar{
			X: strconv.Itoa(i * sparkStep),
			Y: strconv.FormatInt(sparkHeight-h, 10),
			H: strconv.FormatInt(h, 10),
		}
	}
	return s
}

type overviewView struct {
	layout
	Rows      []*tenantRow
	Throttled int
	Create    *form
	// Parents are the tenants a new tenant may nest under.
	Parents []parentOption
	// Windows are every tenant's calendar windows, in tree order.
	Windows windowsView
	// Reads says where the ledger pages and tallies read and how far
	// behind that is, nil without --read-database-url.
	Reads *readsNote
}

// readsNote is the state of the reads pool (a streaming replica) as the
// overview shows it: an operator reading the ledger pages must know how
// stale they may be.
type readsNote struct {
	Standby bool
	OK      bool
	Lag     string // "0.4 s, 12.0 kB", "none"
	Seconds string // the lag in seconds, for data-lag-seconds
	At      string // the reading's time, UTC
	Err     string
	// Down: the replica could not be reached, and the reads go to the
	// primary until it answers again (replica.Reads); DownErr says why.
	Down    bool
	DownErr string
}

// readsNote is nil when the reads go to the primary's pool.
func (d *Dashboard) readsNote() *readsNote {
	if d.lag == nil {
		return nil
	}
	r := d.lag.Last()
	n := &readsNote{Standby: r.Standby, OK: r.OK, Err: r.Err, Seconds: strconv.FormatFloat(r.Seconds, 'f', 3, 64), Lag: "none",
		DownErr: d.readsDown()}
	n.Down = n.DownErr != ""
	if !r.At.IsZero() {
		n.At = r.At.UTC().Format("15:04:05")
	}
	if r.Bytes > 0 {
		n.Lag = strconv.FormatFloat(r.Seconds, 'f', 1, 64) + " s, " + strconv.FormatFloat(float64(r.Bytes)/1000, 'f', 1, 64) + " kB of WAL"
	}
	return n
}

// overview lists the tenants; ?parent= preselects the create form's
// parent (the tenant page's "nest a tenant here" link).
func (d *Dashboard) overview(c *echo.Context) error {
	f := newForm()
	f.Set("parent", c.QueryParam("parent"))
	return d.renderOverview(c, http.StatusOK, f)
}

func (d *Dashboard) renderOverview(c *echo.Context, status int, create *form) error {
	ctx := c.Request().Context()
	snaps, err := d.admin.TenantList(ctx)
	if err != nil {
		return err
	}
	rows, err := d.tenantRows(ctx, snaps)
	if err != nil {
		return err
	}
	v := &overviewView{
		layout:  layout{Title: "Overview", Nav: "overview", Session: sessionOf(c), Flash: flash(c), Live: "/ui/overview.json"},
		Rows:    rows,
		Create:  create,
		Parents: parentOptions(snaps, create.Get("parent")),
		Reads:   d.readsNote(),
	}
	if v.Windows, err = d.windowLines(ctx, snaps, rows); err != nil {
		return err
	}
	for _, r := range rows {
		if r.Status == "throttled" {
			v.Throttled++
		}
	}
	return d.render(c, status, "overview.html", v)
}

// tenantCreate creates a tenant from the overview's form. A refused form
// comes back filled in, with the reason next to the field.
func (d *Dashboard) tenantCreate(c *echo.Context) error {
	posted := postForm(c)
	f := formFrom(posted, append([]string{"id", "parent"}, limitFields...)...)
	id := f.Get("id")
	f.limitError(rule.ValidateTenantID(id))
	windowsFromPost(f, posted)
	js, rowOf := windowsFromForm(f)
	f.windowRows = rowOf
	l := f.limits()
	if f.OK() && len(js) > 0 {
		ws, err := rule.ParseWindows(js)
		if !f.limitError(err) {
			l.Windows = ws
			f.limitError(l.Validate())
		}
	}
	if !f.OK() {
		return d.renderOverview(c, http.StatusUnprocessableEntity, f)
	}
	_, err := d.admin.TenantCreate(c.Request().Context(), account.CreateTenantParams{ID: id, Parent: f.Get("parent"), Limits: l, Actor: actor(c)})
	switch {
	case errors.Is(err, rule.ErrTenantExists):
		f.Fail("id", "a tenant with this id already exists")
		return d.renderOverview(c, http.StatusUnprocessableEntity, f)
	case f.limitError(err):
		return d.renderOverview(c, http.StatusUnprocessableEntity, f)
	case err != nil:
		return err
	}
	return seeOther(c, "/tenants/"+pathEscape(id)+"?done=created")
}
