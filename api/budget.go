package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v5"
	"github.com/tokengate/tokengate/budget/rule"
)

type budgetJSON struct {
	// snap is what the budget renders: withSpend sums its windows' spend.
	snap     rule.Snapshot
	Tenant   string `json:"tenant"`
	Disabled bool   `json:"disabled"`
	// Parent and Path place the tenant in its budget tree (Path: its
	// ancestors, root first; every admission must fit each of them too).
	Parent *string  `json:"parent"`
	Path   []string `json:"path"`
	Limits struct {
		TokensCapacity     int64        `json:"tokens_capacity"`
		TokensPerSecond    json.Number  `json:"tokens_per_second"`
		RequestsCapacity   *int64       `json:"requests_capacity"`
		RequestsPerSecond  *json.Number `json:"requests_per_second"`
		MaxConcurrent      *int64       `json:"max_concurrent"`
		PeriodBudget       *int64       `json:"period_budget"`
		Period             *string      `json:"period"`
		ReservationTTLMS   int64        `json:"reservation_ttl_ms"`
		MaxWaitMS          int64        `json:"max_wait_ms"`
		OnStoreUnavailable *string      `json:"on_store_unavailable"`
		Shadow             []string     `json:"shadow"`
		// Windows are the tenant's calendar windows, the "period" window
		// (period_budget, period) among them.
		Windows []rule.WindowJSON `json:"windows"`
	} `json:"limits"`
	Balances struct {
		Tokens           json.Number  `json:"tokens"`
		TokensFullInMS   int64        `json:"tokens_full_in_ms"`
		Requests         *json.Number `json:"requests"`
		OpenReservations int64        `json:"open_reservations"`
		PeriodUsed       *int64       `json:"period_used"`
		PeriodRemaining  *int64       `json:"period_remaining"`
		PeriodStart      *time.Time   `json:"period_start"`
		PeriodEnd        *time.Time   `json:"period_end"`
		Windows          []windowJSON `json:"windows"`
	} `json:"balances"`
	At time.Time `json:"at"`
}

func (s *Server) getBudget(c *echo.Context) error {
	snap, err := s.admin.Tenant(c.Request().Context(), tenantOf(c))
	if err != nil {
		return err
	}
	return s.respond(c, http.StatusOK, budgetOf(snap), &snap)
}

// budgetOf renders a tenant's limits and balances, for the tenant itself
// (GET /v1/budget) and for admins.
func budgetOf(snap rule.Snapshot) budgetJSON {
	var out budgetJSON
	l := snap.Limits
	out.Tenant, out.At, out.Disabled = snap.TenantID, snap.At, snap.Disabled
	out.Path, out.Limits.Shadow = []string{}, l.Shadow.Strings()
	if len(snap.Path) > 0 {
		parent := snap.Parent()
		out.Parent, out.Path = &parent, snap.Path
	}
	out.Limits.TokensCapacity = l.TokensCapacity
	out.Limits.TokensPerSecond = json.Number(rule.FormatRate(l.TokensRateMicro))
	out.Limits.ReservationTTLMS = l.ReservationTTL.Milliseconds()
	out.Limits.MaxWaitMS = l.MaxWait.Milliseconds()
	if l.OnStoreUnavailable != rule.PolicyDefault {
		policy := string(l.OnStoreUnavailable)
		out.Limits.OnStoreUnavailable = &policy
	}
	out.Balances.Tokens = json.Number(formatMicro(snap.TokensMicro))
	out.Balances.TokensFullInMS = snap.TokensFullIn.Milliseconds()
	out.Balances.OpenReservations = snap.OpenReservations
	if l.RequestsCapacity > 0 {
		rate := json.Number(rule.FormatRate(l.RequestsRateMicro))
		req := json.Number(formatMicro(snap.RequestsMicro))
		out.Limits.RequestsCapacity, out.Limits.RequestsPerSecond = &l.RequestsCapacity, &rate
		out.Balances.Requests = &req
	}
	if l.MaxConcurrent > 0 {
		out.Limits.MaxConcurrent = &l.MaxConcurrent
	}
	out.Limits.Windows = rule.WindowsJSON(l.Windows)
	out.snap = snap
	out.Balances.Windows = make([]windowJSON, 0, len(snap.Windows))
	for _, w := range snap.Windows {
		out.Balances.Windows = append(out.Balances.Windows, windowOf(w, snap.At))
	}
	if l.PeriodBudget > 0 {
		period := string(l.Period)
		remaining := snap.PeriodRemaining()
		out.Limits.PeriodBudget, out.Limits.Period = &l.PeriodBudget, &period
		out.Balances.PeriodUsed, out.Balances.PeriodRemaining = &snap.PeriodUsed, &remaining
		out.Balances.PeriodStart, out.Balances.PeriodEnd = &snap.PeriodStart, &snap.PeriodEnd
	}
	return out
}

// windowJSON is one window's current span and usage. Amounts are whole
// cost units for a tokens window and decimal amounts of the deployment's
// currency for a money window; start and end are in the window's time
// zone (their offset is the zone's at that instant), so the reset reads as
// the tenant set it.
type windowJSON struct {
	Name      string      `json:"name"`
	Counts    string      `json:"counts"`
	Limit     json.Number `json:"limit"`
	Ceiling   json.Number `json:"ceiling"`
	Used      json.Number `json:"used"`
	Remaining json.Number `json:"remaining"`
	Start     string      `json:"start"`
	End       string      `json:"end"`
	TimeZone  string      `json:"time_zone"`
	ResetInMS int64       `json:"reset_in_ms"`
	// MoneySpent is what the tenant's ledger entries moved in money since
	// start, and Currency the deployment's: the spend of a window that
	// counts tokens (for a money window, what its entries say it used).
	// Only the admin routes fill them (withSpend): it is a ledger query,
	// which GET /v1/budget, on a caller's hot path, does not pay.
	MoneySpent *json.Number `json:"money_spent,omitempty"`
	Currency   string       `json:"currency,omitempty"`
}

func windowOf(w rule.WindowSnapshot, at time.Time) windowJSON {
	amount := func(n int64) json.Number {
		if w.Counts == rule.CountMoney {
			return json.Number(formatMicro(n))
		}
		return json.Number(strconv.FormatInt(n, 10))
	}
	loc := w.Location
	if loc == nil {
		loc = time.UTC
	}
	return windowJSON{Name: w.Name, Counts: string(w.Counts), Limit: amount(w.Limit), Ceiling: amount(w.Ceiling()),
		Used: amount(w.Used), Remaining: amount(w.Remaining()), Start: w.Start.In(loc).Format(time.RFC3339),
		End: w.End.In(loc).Format(time.RFC3339), TimeZone: loc.String(), ResetInMS: max(0, w.End.Sub(at).Milliseconds())}
}

// withSpend fills money_spent and currency in every window of tenants, in
// two round trips whatever their number (a tree, a listing).
func (s *Server) withSpend(ctx context.Context, tenants ...*budgetJSON) error {
	snaps := make([]rule.Snapshot, len(tenants))
	for i, t := range tenants {
		snaps[i] = t.snap
	}
	spend, err := s.admin.WindowSpend(ctx, snaps...)
	if err != nil {
		return err
	}
	i := 0
	for _, t := range tenants {
		for j := range t.Balances.Windows {
			n := json.Number(formatMicro(spend.Money[i]))
			t.Balances.Windows[j].MoneySpent, t.Balances.Windows[j].Currency = &n, spend.Currency
			i++
		}
	}
	return nil
}

// adminBudget renders snap for the admin routes: budgetOf with each
// window's money spent.
func (s *Server) adminBudget(c *echo.Context, status int, snap rule.Snapshot) error {
	out := budgetOf(snap)
	if err := s.withSpend(c.Request().Context(), &out); err != nil {
		return err
	}
	return c.JSON(status, out)
}

// respond writes a JSON body with the tenant's rate-limit headers, reading
// a snapshot when the handler has none.
func (s *Server) respond(c *echo.Context, status int, body any, snap *rule.Snapshot) error {
	if snap != nil {
		s.setRateHeaders(c, *snap)
	} else {
		s.ensureRateHeaders(c)
	}
	return c.JSON(status, body)
}

// setRateHeaders sets the X-RateLimit-* headers every tenant response
// carries, with OpenAI's names and formats.
func (s *Server) setRateHeaders(c *echo.Context, snap rule.Snapshot) {
	h := c.Response().Header()
	for _, rh := range snap.RateHeaders() {
		h.Set(rh.Name, rh.Value)
	}
}

// ensureRateHeaders sets the headers from a fresh snapshot unless the
// handler already did; it is best effort and never fails the response.
func (s *Server) ensureRateHeaders(c *echo.Context) {
	tenantID := tenantOf(c)
	h := c.Response().Header()
	if tenantID == "" || h.Get("X-Ratelimit-Limit-Tokens") != "" || h.Get("X-Ratelimit-Limit-Budget") != "" {
		return
	}
	if r, _ := echo.UnwrapResponse(c.Response()); r != nil && r.Committed {
		return
	}
	if snap, err := s.admitter.Snapshot(c.Request().Context(), tenantID); err == nil {
		s.setRateHeaders(c, snap)
	}
}

// withRateHeaders makes sure error responses of tenant routes carry the
// rate-limit headers too.
func (s *Server) withRateHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c *echo.Context) error {
		err := next(c)
		if err != nil {
			s.ensureRateHeaders(c)
		}
		return err
	}
}

// formatMicro renders micro-units as an exact decimal number.
func formatMicro(v int64) string {
	if v < 0 {
		return "-" + rule.FormatRate(-v)
	}
	return rule.FormatRate(v)
}
