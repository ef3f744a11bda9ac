package web

import (
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/batch"
	"github.com/tokengate/tokengate/budget/rule"
)

// A tenant's batch allowance is the capacity of tokens (at batch prices)
// its open batches may hold at once through the proxy, beside its
// per-minute limits. The tenant page shows what is enqueued against it
// and edits it with a small form.

// batchView is a tenant's batch allowance on its page.
type batchView struct {
	Set      bool // false: the tenant has none, and its batches are refused
	Gauge    gauge
	Form     *form
	Capacity int64
}

// batchFields are the batch allowance form's fields, named like the
// rule.LimitError fields of batch.SetAllowance.
var batchFields = []string{"batch_tokens_capacity"}

// batchAllowanceView loads a tenant's allowance for its page.
func (d *Dashboard) batchAllowanceView(ctx context.Context, id string) (batchView, error) {
	a, err := d.admin.BatchAllowance(ctx, id)
	if errors.Is(err, batch.ErrNoAllowance) {
		return batchView{Form: newForm()}, nil
	}
	if err != nil {
		return batchView{}, err
	}
	f := newForm()
	f.Set("batch_tokens_capacity", strconv.FormatInt(a.Capacity, 10))
	g := gauge{Name: "batch", Set: true, Text: "0 / 0", Pct: "0", Level: "bad"}
	if a.Capacity > 0 {
		g = balanceGauge("batch", a.Capacity-(a.EnqueuedMicro+rule.Micro-1)/rule.Micro, a.Capacity)
	}
	return batchView{Set: true, Capacity: a.Capacity, Gauge: g, Form: f}, nil
}

// batchAllowanceSet sets a tenant's batch allowance; budget records the
// change, before and after, as a limits entry.
func (d *Dashboard) batchAllowanceSet(c *echo.Context) error {
	id := c.Param("id")
	f := formFrom(postForm(c), batchFields...)
	capacity := f.Int("batch_tokens_capacity", true)
	if f.OK() {
		_, err := d.admin.BatchAllowanceSet(c.Request().Context(), batch.SetAllowanceParams{TenantID: id, Capacity: capacity, Actor: actor(c)})
		if !f.limitError(err) && err != nil {
			return err
		}
	}
	if !f.OK() {
		return d.renderTenant(c, id, http.StatusUnprocessableEntity, func(v *tenantView) { v.Batch.Form = f })
	}
	return seeOther(c, tenantURL(id, "batch_allowance"))
}
