package web

import (
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
)

// A tenant's model limits are its input and output token buckets for one
// model, in raw tokens, as providers state ITPM and OTPM. The tenant page
// shows them beside its tenant-wide limits, since an admission for the
// model must fit both, and edits them with a form like the limits form.

// bucketView is one model bucket: a gauge of the balance against the
// capacity, and its refill rate. An unset bucket has an unset gauge.
type bucketView struct {
	Gauge gauge
	Rate  string // tokens per second, rule.FormatRate
}

// modelLimitRow is one model's row in the tenant page's model limits.
type modelLimitRow struct {
	Model         string
	Input, Output bucketView
}

// wholeTokens is a micro-token balance in whole tokens, rounded down (as
// the tenant gauges round), so a sliver short of a token is not shown as
// one.
func wholeTokens(micro int64) int64 {
	q := micro / rule.Micro
	if micro%rule.Micro != 0 && micro < 0 {
		q--
	}
	return q
}

// modelLimitRows lays out a tenant's model limits, in the store's order.
func modelLimitRows(snaps []rule.ModelSnapshot) []modelLimitRow {
	bucket := func(name string, capacity, rate, micro int64, shadow bool) bucketView {
		if capacity <= 0 {
			return bucketView{Gauge: gauge{Name: name, Text: "not set", Pct: "0", Level: "ok"}}
		}
		g := balanceGauge(name, wholeTokens(micro), capacity)
		g.Shadow = shadow
		return bucketView{Gauge: g, Rate: rule.FormatRate(rate)}
	}
	rows := make([]modelLimitRow, 0, len(snaps))
	for _, s := range snaps {
		l := s.Limits
		rows = append(rows, modelLimitRow{
			Model:  l.Model,
			Input:  bucket("input", l.InputCapacity, l.InputRateMicro, s.InputMicro, l.Shadow.Has(rule.LimitInputTokens)),
			Output: bucket("output", l.OutputCapacity, l.OutputRateMicro, s.OutputMicro, l.Shadow.Has(rule.LimitOutputTokens)),
		})
	}
	return rows
}

// modelLimitFields are the model limits form's fields, named like the
// rule.LimitError fields of rule.ModelLimits.Validate.
var modelLimitFields = []string{"model", "input_tokens_capacity", "input_tokens_per_second",
	"output_tokens_capacity", "output_tokens_per_second", "shadow"}

// modelLimits reads the model limits form and validates it with budget's
// own rules; a blank bucket is not set.
func (f *form) modelLimits() rule.ModelLimits {
	m := rule.ModelLimits{
		Model:           f.Get("model"),
		InputCapacity:   f.Int("input_tokens_capacity", false),
		InputRateMicro:  f.Decimal("input_tokens_per_second", false),
		OutputCapacity:  f.Int("output_tokens_capacity", false),
		OutputRateMicro: f.Decimal("output_tokens_per_second", false),
	}
	if m.Model == "" {
		f.Fail("model", "is required")
	}
	shadow, err := rule.ParseLimitSet("shadow", f.List("shadow"))
	f.limitError(err)
	m.Shadow = shadow
	if f.OK() {
		f.limitError(m.Validate())
	}
	return m
}

// modelLimitsForm fills the form from a model's current limits, for its
// edit link; an unset bucket stays blank.
func modelLimitsForm(l rule.ModelLimits) *form {
	f := newForm()
	f.Set("model", l.Model)
	if l.InputCapacity > 0 {
		f.Set("input_tokens_capacity", strconv.FormatInt(l.InputCapacity, 10))
		f.Set("input_tokens_per_second", rule.FormatRate(l.InputRateMicro))
	}
	if l.OutputCapacity > 0 {
		f.Set("output_tokens_capacity", strconv.FormatInt(l.OutputCapacity, 10))
		f.Set("output_tokens_per_second", rule.FormatRate(l.OutputRateMicro))
	}
	f.Set("shadow", strings.Join(l.Shadow.Strings(), ","))
	return f
}

// modelLimitsEdit is the form a tenant page opens with: the limits of the
// model its ?model= names (its row's edit link), else a blank one.
func modelLimitsEdit(snaps []rule.ModelSnapshot, model string) *form {
	for _, s := range snaps {
		if model != "" && s.Limits.Model == model {
			return modelLimitsForm(s.Limits)
		}
	}
	return newForm()
}

// modelLimitsSet creates or replaces a tenant's limits for a model; budget
// keeps what a kept bucket had spent and records the change, before and
// after, as a limits entry.
func (d *Dashboard) modelLimitsSet(c *echo.Context) error {
	id := c.Param("id")
	f := formFrom(postForm(c), modelLimitFields...)
	l := f.modelLimits()
	if f.OK() {
		_, err := d.admin.ModelLimitsSet(c.Request().Context(), account.SetModelLimitsParams{TenantID: id, Limits: l, Actor: actor(c)})
		if !f.limitError(err) && err != nil {
			return err
		}
	}
	if !f.OK() {
		return d.renderTenant(c, id, http.StatusUnprocessableEntity, func(v *tenantView) { v.ModelForm = f })
	}
	return seeOther(c, tenantURL(id, "model_limits"))
}

// modelLimitsRemove removes a tenant's limits for a model (named in the
// body: model names may hold slashes), with a limits entry.
func (d *Dashboard) modelLimitsRemove(c *echo.Context) error {
	id := c.Param("id")
	err := d.admin.ModelLimitsRemove(c.Request().Context(), id, postForm(c).Get("model"), actor(c))
	if errors.Is(err, rule.ErrModelLimitsNotFound) {
		return pageErr(http.StatusNotFound, "This tenant has no limits for that model (they may have been removed already).")
	}
	if err != nil {
		return err
	}
	return seeOther(c, tenantURL(id, "model_removed"))
}

// keyPriority sets a key's priority class, which orders the callers
// waiting for an upstream pool; the change is a tenant entry in the
// ledger.
func (d *Dashboard) keyPriority(c *echo.Context) error {
	id := c.Param("id")
	p := rule.Priority(postForm(c).Get("priority"))
	err := d.admin.KeySetPriority(c.Request().Context(), id, c.Param("key"), p, actor(c))
	switch {
	case errors.Is(err, credential.ErrBadPriority):
		return pageErr(http.StatusUnprocessableEntity, "A key's priority is critical, standard or sheddable.")
	case errors.Is(err, credential.ErrKeyNotFound):
		return pageErr(http.StatusNotFound, "This tenant has no such active key (it may have been revoked).")
	case err != nil:
		return err
	}
	return seeOther(c, tenantURL(id, "priority"))
}

// priorities are the classes a key's select offers, first served first.
var priorities = []rule.Priority{rule.PriorityCritical, rule.PriorityStandard, rule.PrioritySheddable}
