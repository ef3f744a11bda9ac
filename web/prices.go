package web

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/estimator"
)

type pricesView struct {
	layout
	Prices   []estimator.Price
	Currency string
	Form     *form
}

// priceFields are the price form's fields; the long-context tier's are
// flat here (long_*), long_context.* in the API and in errors.
var priceFields = []string{"model", "service_tier", "input", "output", "cached_input", "cache_write_5m", "cache_write_1h", "reasoning_output",
	"long_threshold", "long_input", "long_output", "effective_from"}

func (d *Dashboard) pricesPage(c *echo.Context) error {
	return d.renderPrices(c, http.StatusOK, newForm())
}

func (d *Dashboard) renderPrices(c *echo.Context, status int, f *form) error {
	ctx := c.Request().Context()
	ps, err := d.admin.PriceList(ctx, "", "", time.Now())
	if err != nil {
		return err
	}
	cur, err := d.admin.PriceCurrency(ctx)
	if err != nil {
		return err
	}
	return d.render(c, status, "prices.html", &pricesView{
		layout:   layout{Title: "Prices", Nav: "prices", Session: sessionOf(c), Flash: flash(c)},
		Prices:   ps,
		Currency: cur,
		Form:     f,
	})
}

// price reads the form into a price row, recording each bad field.
func (f *form) price() estimator.Price {
	p := estimator.Price{Model: f.Get("model"), ServiceTier: strings.ToLower(f.Get("service_tier"))} // blank: default; the domain judges it
	if p.Model == "" {
		f.Fail("model", "is required")
	}
	amount := func(name string, required bool) *int64 {
		s := cleanNumber(f.Get(name))
		if s == "" {
			if required {
				f.Fail(name, "is required")
			}
			return nil
		}
		v, err := estimator.ParsePrice(s, name)
		var inv *estimator.InvalidError
		if errors.As(err, &inv) {
			f.Fail(name, inv.Reason)
			return nil
		}
		return &v
	}
	if v := amount("input", true); v != nil {
		p.InputMicro = *v
	}
	if v := amount("output", true); v != nil {
		p.OutputMicro = *v
	}
	p.CachedInputMicro = amount("cached_input", false)
	p.CacheWrite5mMicro = amount("cache_write_5m", false)
	p.CacheWrite1hMicro = amount("cache_write_1h", false)
	p.ReasoningOutputMicro = amount("reasoning_output", false)
	p.LongInputMicro = amount("long_input", false)
	p.LongOutputMicro = amount("long_output", false)
	if s := cleanNumber(f.Get("long_threshold")); s != "" {
		v := f.Int("long_threshold", false)
		p.LongContextThreshold = &v
	}
	if s := f.Get("effective_from"); s != "" {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			f.Fail("effective_from", "must be an RFC 3339 time such as 2027-01-01T00:00:00Z, or blank for now")
		}
		p.EffectiveFrom = t
	}
	return p
}

// formField maps a price field as the estimator names it to the form's.
func formField(field string) string {
	if rest, ok := strings.CutPrefix(field, "long_context"); ok {
		switch rest {
		case ".input":
			return "long_input"
		case ".output":
			return "long_output"
		}
		return "long_threshold"
	}
	return field
}

// priceAdd appends a price row (now or later, never in the past), recorded
// with the admin's name; prices are never edited, so there is no edit form.
func (d *Dashboard) priceAdd(c *echo.Context) error {
	ctx := c.Request().Context()
	f := formFrom(postForm(c), priceFields...)
	p := f.price()
	if f.OK() {
		p.Source, p.CreatedBy = "dashboard", actor(c)
		_, err := d.admin.PriceAdd(ctx, p)
		var inv *estimator.InvalidError
		switch {
		case errors.As(err, &inv):
			f.Fail(formField(inv.Field), inv.Reason)
		case err != nil:
			return err
		}
	}
	if !f.OK() {
		return d.renderPrices(c, http.StatusUnprocessableEntity, f)
	}
	return seeOther(c, "/prices?done=price_added")
}
