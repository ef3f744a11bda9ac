package web

import (
	"errors"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/rule"
)

// The alerts page tells an admin where budget alerts go and whether they
// got there: the endpoints (each with a signing secret shown once), the
// rules that raise events, and the delivery log of the outbox with every
// attempt. A receiver that failed can be seen failing, and an event given
// up can be sent again.

// alertEventLimit bounds the delivery log the page loads.
const alertEventLimit = 100

// alertKinds are the rule kinds the form offers, with what each watches.
var alertKinds = []struct{ Kind, Label string }{
	{alert.KindPeriodBudget, "the period budget crosses a threshold"},
	{alert.KindThrottled, "a limit refuses for minutes on end"},
	{alert.KindInvariant, "the ledger watch finds a balance wrong"},
}

// alertLimits are the limits a throttled rule may name (the tenant's, its
// model buckets' and the upstream pool's), as rejections name them.
var alertLimits = slices.Concat(rule.AllLimits, rule.ModelLimitNames, []rule.Limit{rule.LimitPool})

// alertEventStates are the states the delivery log can be filtered by.
var alertEventStates = []string{"pending", "delivered", "failed"}

// ruleFields are the rule form's fields, named like the alert.FieldError
// fields of alert.Store.CreateRule.
var ruleFields = []string{"tenant", "endpoint", "kind", "thresholds", "limit", "sustain_minutes"}

type alertsView struct {
	layout
	// KeyMissing: the server has no alert key, so endpoints cannot be
	// created or rotated and nothing is delivered.
	KeyMissing bool
	Endpoints  []alert.Endpoint
	// Enabled are the endpoints a new rule may send to.
	Enabled []alert.Endpoint
	Rules   []ruleRow
	Events  []eventRow
	// Filter narrows the delivery log (state, tenant, endpoint; from the
	// query string).
	Filter      *form
	NewEndpoint *form
	NewRule     *form
	// Secret is set only on the answer to the POST that created or rotated
	// an endpoint: the one time its secret is shown.
	Secret  *endpointSecret
	Tenants []string
	Kinds   []struct{ Kind, Label string }
	Limits  []rule.Limit
	States  []string
	Limit   int
}

type endpointSecret struct {
	EndpointID string
	Secret     string
	Rotated    bool
}

// ruleRow is a rule as the rules table shows it.
type ruleRow struct {
	ID          int64
	Tenant      string // "" for every tenant
	EndpointID  string
	EndpointOff bool
	Kind        string
	Details     string
}

// eventRow is an event of the delivery log with its attempts.
type eventRow struct {
	alert.Event
	Log []attemptRow
}

type attemptRow struct {
	Attempt  int
	Replica  string
	Outcome  string
	Status   string
	Error    string
	Duration string
	Started  string
}

// ruleDetails is what a rule watches, in a few words: "50%, 80%, 100%",
// "tokens, 5 minutes", "any limit, 5 minutes", "—".
func ruleDetails(r alert.Rule) string {
	switch r.Kind {
	case alert.KindPeriodBudget:
		parts := make([]string, 0, len(r.Thresholds))
		for _, t := range r.Thresholds {
			parts = append(parts, strconv.Itoa(int(t))+"%")
		}
		return strings.Join(parts, ", ")
	case alert.KindThrottled:
		limit := "any limit"
		if r.Limit != nil {
			limit = *r.Limit
		}
		minutes := int32(0)
		if r.SustainMinutes != nil {
			minutes = *r.SustainMinutes
		}
		unit := " minutes"
		if minutes == 1 {
			unit = " minute"
		}
		return limit + ", " + strconv.Itoa(int(minutes)) + unit
	}
	return "—"
}

func ruleRows(rules []alert.Rule, eps []alert.Endpoint) []ruleRow {
	off := map[string]bool{}
	for _, e := range eps {
		off[e.ID] = e.DisabledAt != nil
	}
	rows := make([]ruleRow, 0, len(rules))
	for _, r := range rules {
		row := ruleRow{ID: r.ID, EndpointID: r.EndpointID, EndpointOff: off[r.EndpointID], Kind: r.Kind, Details: ruleDetails(r)}
		if r.TenantID != nil {
			row.Tenant = *r.TenantID
		}
		rows = append(rows, row)
	}
	return rows
}

func eventRows(events []alert.Event) []eventRow {
	rows := make([]eventRow, 0, len(events))
	for _, e := range events {
		row := eventRow{Event: e}
		for _, a := range e.Log {
			ar := attemptRow{Attempt: a.Attempt, Replica: a.Replica, Outcome: a.Outcome, Started: fmtTime(a.StartedAt)}
			if a.StatusCode != nil {
				ar.Status = strconv.Itoa(*a.StatusCode)
			}
			if a.Error != nil {
				ar.Error = *a.Error
			}
			if a.DurationMS != nil {
				ar.Duration = groupDigits(int64(*a.DurationMS)) + " ms"
			}
			row.Log = append(row.Log, ar)
		}
		rows = append(rows, row)
	}
	return rows
}

// alertError records an *alert.FieldError under its field; it reports
// whether err was one.
func (f *form) alertError(err error) bool {
	var fe *alert.FieldError
	if errors.As(err, &fe) {
		f.Fail(fe.Field, fe.Reason)
		return true
	}
	return false
}

// percents reads a comma-separated list of whole percentages ("50, 80,
// 100%"); their range is alert's to check.
func (f *form) percents(name string) []int32 {
	var out []int32
	for _, part := range strings.Split(f.Get(name), ",") {
		part = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(part), "%"))
		if part == "" {
			continue
		}
		n, err := strconv.ParseInt(part, 10, 32)
		if err != nil {
			f.Fail(name, "must be whole percentages separated by commas, such as 50, 80, 100")
			return nil
		}
		out = append(out, int32(n))
	}
	return out
}

// ruleParams reads the rule form; alert validates the rule itself.
func (f *form) ruleParams() alert.RuleParams {
	p := alert.RuleParams{
		TenantID:   f.Get("tenant"),
		EndpointID: f.Get("endpoint"),
		Kind:       f.Get("kind"),
		Thresholds: f.percents("thresholds"),
		Limit:      f.Get("limit"),
	}
	switch n := f.Int("sustain_minutes", false); {
	case n > math.MaxInt32:
		f.Fail("sustain_minutes", "must be from 1 to 1440")
	default:
		p.SustainMinutes = int32(n)
	}
	return p
}

// renderAlerts loads the alerts page; edit adjusts the view (a refused
// form, a new secret) before it is rendered.
func (d *Dashboard) renderAlerts(c *echo.Context, status int, edit func(*alertsView)) error {
	ctx := c.Request().Context()
	filter := formFrom(c.QueryParams(), "state", "tenant", "endpoint")
	eps, err := d.admin.AlertEndpointList(ctx)
	if err != nil {
		return err
	}
	rules, err := d.admin.AlertRuleList(ctx, "")
	if err != nil {
		return err
	}
	events, err := d.admin.AlertEventList(ctx, alert.EventFilter{TenantID: filter.Get("tenant"), State: filter.Get("state"),
		EndpointID: filter.Get("endpoint"), Limit: alertEventLimit})
	switch {
	case filter.alertError(err):
		if status == http.StatusOK {
			status = http.StatusBadRequest
		}
	case err != nil:
		return err
	}
	snaps, err := d.admin.TenantList(ctx)
	if err != nil {
		return err
	}
	v := &alertsView{
		layout:      layout{Title: "Alerts", Nav: "alerts", Session: sessionOf(c), Flash: flash(c)},
		KeyMissing:  !d.admin.AlertsHaveKey(),
		Endpoints:   eps,
		Rules:       ruleRows(rules, eps),
		Events:      eventRows(events),
		Filter:      filter,
		NewEndpoint: newForm(),
		NewRule:     newForm(),
		Kinds:       alertKinds,
		Limits:      alertLimits,
		States:      alertEventStates,
		Limit:       alertEventLimit,
	}
	v.NewRule.Set("kind", alert.KindPeriodBudget)
	for _, e := range eps {
		if e.DisabledAt == nil {
			v.Enabled = append(v.Enabled, e)
		}
	}
	for _, s := range snaps {
		v.Tenants = append(v.Tenants, s.TenantID)
	}
	if edit != nil {
		edit(v)
	}
	return d.render(c, status, "alerts.html", v)
}

func (d *Dashboard) alertsPage(c *echo.Context) error { return d.renderAlerts(c, http.StatusOK, nil) }

// noAlertKey answers a form that needs the alert key on a server without
// one: the alerts page, whose notice says why (409, as the API answers).
func (d *Dashboard) noAlertKey(c *echo.Context, f *form) error {
	return d.renderAlerts(c, http.StatusConflict, func(v *alertsView) {
		v.KeyMissing = true
		if f != nil {
			v.NewEndpoint = f
		}
	})
}

// showSecret answers with the alerts page showing an endpoint's secret.
// That answer is the only place the secret ever appears: it is derived,
// never stored, logged or put in a URL, and the page's script swaps the
// address for the plain alerts page so that a reload shows it no more.
func (d *Dashboard) showSecret(c *echo.Context, s *endpointSecret) error {
	return d.renderAlerts(c, http.StatusOK, func(v *alertsView) {
		v.Secret = s
		v.ReplaceURL = "/alerts"
	})
}

// alertEndpointCreate adds an endpoint and shows its signing secret once.
func (d *Dashboard) alertEndpointCreate(c *echo.Context) error {
	f := formFrom(postForm(c), "url", "description")
	ep, secret, err := d.admin.AlertEndpointCreate(c.Request().Context(), f.Get("url"), f.Get("description"))
	switch {
	case errors.Is(err, alert.ErrNoKey):
		return d.noAlertKey(c, f)
	case f.alertError(err):
		return d.renderAlerts(c, http.StatusUnprocessableEntity, func(v *alertsView) { v.NewEndpoint = f })
	case err != nil:
		return err
	}
	return d.showSecret(c, &endpointSecret{EndpointID: ep.ID, Secret: secret})
}

// alertEndpointRotate gives an endpoint a new secret, shown once; the old
// one stops signing at once.
func (d *Dashboard) alertEndpointRotate(c *echo.Context) error {
	id := c.Param("id")
	secret, err := d.admin.AlertEndpointRotate(c.Request().Context(), id)
	switch {
	case errors.Is(err, alert.ErrNoKey):
		return d.noAlertKey(c, nil)
	case errors.Is(err, alert.ErrNotFound):
		return pageErr(http.StatusNotFound, "There is no enabled alert endpoint with that id (it may have been disabled).")
	case err != nil:
		return err
	}
	return d.showSecret(c, &endpointSecret{EndpointID: id, Secret: secret, Rotated: true})
}

// alertEndpointDisable stops deliveries to an endpoint; its log stays.
func (d *Dashboard) alertEndpointDisable(c *echo.Context) error {
	err := d.admin.AlertEndpointDisable(c.Request().Context(), c.Param("id"))
	if errors.Is(err, alert.ErrNotFound) {
		return pageErr(http.StatusNotFound, "There is no enabled alert endpoint with that id (it may have been disabled already).")
	}
	if err != nil {
		return err
	}
	return seeOther(c, "/alerts?done=endpoint_disabled")
}

// alertRuleCreate adds a rule; it applies from the next decision on.
func (d *Dashboard) alertRuleCreate(c *echo.Context) error {
	f := formFrom(postForm(c), ruleFields...)
	p := f.ruleParams()
	if f.OK() {
		_, err := d.admin.AlertRuleCreate(c.Request().Context(), p)
		if !f.alertError(err) && err != nil {
			return err
		}
	}
	if !f.OK() {
		return d.renderAlerts(c, http.StatusUnprocessableEntity, func(v *alertsView) { v.NewRule = f })
	}
	return seeOther(c, "/alerts?done=rule_created")
}

// alertRuleDelete stops a rule; its events and their log stay.
func (d *Dashboard) alertRuleDelete(c *echo.Context) error {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err == nil {
		err = d.admin.AlertRuleDelete(c.Request().Context(), id)
	} else {
		err = alert.ErrNotFound
	}
	if errors.Is(err, alert.ErrNotFound) {
		return pageErr(http.StatusNotFound, "There is no alert rule with that id (it may have been deleted already).")
	}
	if err != nil {
		return err
	}
	return seeOther(c, "/alerts?done=rule_deleted")
}

// alertEventRedeliver puts a failed event back in the outbox, due now.
func (d *Dashboard) alertEventRedeliver(c *echo.Context) error {
	err := d.admin.AlertEventRedeliver(c.Request().Context(), c.Param("id"))
	if errors.Is(err, alert.ErrNotFound) {
		return pageErr(http.StatusNotFound,
			"Only a failed event of an enabled endpoint can be redelivered (it may have been redelivered already).")
	}
	if err != nil {
		return err
	}
	return seeOther(c, "/alerts?done=redelivered")
}
