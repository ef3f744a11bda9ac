package web

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// liveJSON is what the page's script polls: per tenant, the texts, gauge
// widths and sparkline bars to put in place, in display order.
type liveJSON struct {
	At      time.Time    `json:"at"`
	Tenants []liveTenant `json:"tenants"`
	// Windows are the calendar windows the page shows (its tenants', and
	// on a tenant page its end users'), so that their use, spend and next
	// reset move with the rest.
	Windows []liveWindow `json:"windows"`
}

// liveWindow is one row of the windows table: the gauge, its used / limit
// text, the money spent in the span and the next reset, as the page
// renders them.
type liveWindow struct {
	Tenant   string `json:"tenant"`
	Name     string `json:"name"`
	Used     string `json:"used"`
	Pct      string `json:"pct"`
	Level    string `json:"level"`
	Spent    string `json:"spent"`
	Resets   string `json:"resets"`
	ResetsAt string `json:"resets_at"`
}

type liveTenant struct {
	ID     string                `json:"id"`
	Status string                `json:"status"`
	Fields map[string]string     `json:"fields"`
	Titles map[string]string     `json:"titles"`
	Gauges map[string]liveGauge  `json:"gauges"`
	Sparks map[string][]sparkBar `json:"sparks"`
}

type liveGauge struct {
	Pct   string `json:"pct"`
	Level string `json:"level"`
}

// liveOverview answers the overview's (or one tenant page's, with
// ?tenant=) polling, under the same session as the pages. Tenants come in
// the order the overview lists them (treeOrder), which the script keeps.
func (d *Dashboard) liveOverview(c *echo.Context) error {
	ctx := c.Request().Context()
	var snaps []rule.Snapshot
	var err error
	if id := c.QueryParam("tenant"); id != "" {
		// A tenant page shows its tenant, and its ancestors and children
		// in the tree: all of them move.
		var tree *account.TreeNode
		tree, err = d.admin.TenantTree(ctx, id)
		if errors.Is(err, rule.ErrTenantNotFound) {
			return c.JSON(http.StatusNotFound, jsonError{Error: jsonErrorBody{Type: "not_found", Message: "no such tenant"}})
		}
		snaps, _, _ = treeSnapshots(tree, id)
	} else {
		snaps, err = d.admin.TenantList(ctx)
	}
	var (
		rows    []*tenantRow
		windows windowsView
	)
	if err == nil {
		rows, err = d.tenantRows(ctx, snaps)
	}
	if err == nil {
		windows, err = d.liveWindows(ctx, c.QueryParam("tenant"), snaps, rows)
	}
	if err != nil {
		d.logger.ErrorContext(ctx, "dashboard live update failed", "error", err.Error(),
			"request_id", c.Response().Header().Get(echo.HeaderXRequestID))
		return c.JSON(http.StatusInternalServerError, jsonError{Error: jsonErrorBody{Type: "internal_error", Message: "internal server error"}})
	}
	out := liveJSON{At: time.Now().UTC(), Tenants: make([]liveTenant, 0, len(rows)), Windows: make([]liveWindow, 0, len(windows.Lines))}
	for _, l := range windows.Lines {
		out.Windows = append(out.Windows, liveWindow{Tenant: l.Tenant, Name: l.Name, Used: l.Gauge.Text, Pct: l.Gauge.Pct,
			Level: l.Gauge.Level, Spent: l.Spent, Resets: l.Resets, ResetsAt: l.ResetsAt})
	}
	if len(snaps) > 0 {
		out.At = snaps[0].At.UTC()
	}
	for _, r := range rows {
		t := liveTenant{
			ID:     r.ID,
			Status: r.Status,
			Fields: r.Fields(),
			Titles: map[string]string{"why": r.WhyDetail},
			Gauges: map[string]liveGauge{},
			Sparks: map[string][]sparkBar{},
		}
		for _, g := range []gauge{r.Tokens, r.Requests, r.Period, r.Open} {
			t.Gauges[g.Name] = liveGauge{Pct: g.Pct, Level: g.Level}
		}
		for _, s := range r.Spark {
			t.Sparks[s.Name] = s.Bars
		}
		out.Tenants = append(out.Tenants, t)
	}
	return c.JSON(http.StatusOK, out)
}

// liveWindows is the windows a page shows, as windowLines renders them: a
// tenant page's tree and end users (as renderTenant lists them), or the
// overview's tenants.
func (d *Dashboard) liveWindows(ctx context.Context, tenant string, snaps []rule.Snapshot, rows []*tenantRow) (windowsView, error) {
	if tenant == "" {
		return d.windowLines(ctx, snaps, rows)
	}
	var row *tenantRow
	for _, r := range rows {
		if r.ID == tenant {
			row = r
		}
	}
	users, err := d.endUsers(ctx, tenant)
	if err != nil {
		return windowsView{}, err
	}
	wsnaps, wrows, _ := withEndUsers(snaps, rows, row, users.Users)
	return d.windowLines(ctx, wsnaps, wrows)
}
