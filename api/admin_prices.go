package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/estimator"
)

// priceJSON is a price row as the admin API shows it: amounts are exact
// decimals in currency units per million tokens, as providers publish them.
type priceJSON struct {
	Model           string           `json:"model"`
	ServiceTier     string           `json:"service_tier"`
	EffectiveFrom   time.Time        `json:"effective_from"`
	Currency        string           `json:"currency"`
	Input           json.Number      `json:"input"`
	Output          json.Number      `json:"output"`
	CachedInput     *json.Number     `json:"cached_input"`     // null: as input
	CacheWrite5m    *json.Number     `json:"cache_write_5m"`   // null: as input
	CacheWrite1h    *json.Number     `json:"cache_write_1h"`   // null: as cache_write_5m
	ReasoningOutput *json.Number     `json:"reasoning_output"` // null: as output
	LongContext     *longContextJSON `json:"long_context"`
	Source          string           `json:"source"`
	CreatedAt       time.Time        `json:"created_at"`
	CreatedBy       string           `json:"created_by"`
}

type longContextJSON struct {
	Threshold int64       `json:"threshold"`
	Input     json.Number `json:"input"`
	Output    json.Number `json:"output"`
}

func priceOf(p estimator.Price) priceJSON {
	num := func(v int64) json.Number { return json.Number(estimator.FormatPrice(v)) }
	opt := func(v *int64) *json.Number {
		if v == nil {
			return nil
		}
		n := num(*v)
		return &n
	}
	j := priceJSON{Model: p.Model, ServiceTier: estimator.TierOr(p.ServiceTier), EffectiveFrom: p.EffectiveFrom, Currency: p.Currency, Input: num(p.InputMicro), Output: num(p.OutputMicro),
		CachedInput: opt(p.CachedInputMicro), CacheWrite5m: opt(p.CacheWrite5mMicro), CacheWrite1h: opt(p.CacheWrite1hMicro),
		ReasoningOutput: opt(p.ReasoningOutputMicro), Source: p.Source, CreatedAt: p.CreatedAt, CreatedBy: p.CreatedBy}
	if p.LongContextThreshold != nil {
		j.LongContext = &longContextJSON{Threshold: *p.LongContextThreshold, Input: num(*p.LongInputMicro), Output: num(*p.LongOutputMicro)}
	}
	return j
}

func pricesOf(ps []estimator.Price) []priceJSON {
	out := make([]priceJSON, len(ps))
	for i, p := range ps {
		out[i] = priceOf(p)
	}
	return out
}

// adminPriceList answers the table in effect now, or at ?at=, of every
// service tier or of ?service_tier= only.
func (s *Server) adminPriceList(c *echo.Context) error {
	at := time.Now()
	if q := c.QueryParam("at"); q != "" {
		var err error
		if at, err = time.Parse(time.RFC3339, q); err != nil {
			return invalid("at", "must be an RFC 3339 time")
		}
	}
	ps, err := s.admin.PriceList(c.Request().Context(), c.QueryParam("model"), c.QueryParam("service_tier"), at)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"at": at.UTC(), "prices": pricesOf(ps)})
}

// adminPriceHistory answers every row of one model, oldest first,
// including prices not in effect yet.
func (s *Server) adminPriceHistory(c *echo.Context) error {
	ps, err := s.admin.PriceHistory(c.Request().Context(), c.Param("model"))
	if err != nil {
		return err
	}
	if len(ps) == 0 {
		return &Error{Status: http.StatusNotFound, Type: "not_found", Message: "this model has no price; POST /v1/admin/prices adds one"}
	}
	return c.JSON(http.StatusOK, map[string]any{"model": c.Param("model"), "prices": pricesOf(ps)})
}

// priceIn is the body of POST /v1/admin/prices. Amounts are decimals, as
// numbers or strings.
type priceIn struct {
	Model           *string         `json:"model"`
	ServiceTier     *string         `json:"service_tier"` // absent: default
	EffectiveFrom   *string         `json:"effective_from"`
	Currency        *string         `json:"currency"`
	Input           json.RawMessage `json:"input"`
	Output          json.RawMessage `json:"output"`
	CachedInput     json.RawMessage `json:"cached_input"`
	CacheWrite5m    json.RawMessage `json:"cache_write_5m"`
	CacheWrite1h    json.RawMessage `json:"cache_write_1h"`
	ReasoningOutput json.RawMessage `json:"reasoning_output"`
	LongContext     *struct {
		Threshold *int64          `json:"threshold"`
		Input     json.RawMessage `json:"input"`
		Output    json.RawMessage `json:"output"`
	} `json:"long_context"`
}

// priceAmount reads a decimal price (number or string); absent or null
// leaves dst nil, or is an error when required.
func priceAmount(raw json.RawMessage, field string, required bool) (*int64, error) {
	if raw == nil || isNull(raw) {
		if required {
			return nil, invalid(field, "required")
		}
		return nil, nil
	}
	text := string(bytes.TrimSpace(raw))
	if strings.HasPrefix(text, `"`) {
		if err := json.Unmarshal(raw, &text); err != nil {
			return nil, invalid(field, "must be a decimal")
		}
	}
	v, err := estimator.ParsePrice(text, field)
	if err != nil {
		return nil, err
	}
	return &v, nil
}

func (in *priceIn) price() (estimator.Price, error) {
	var p estimator.Price
	if in.Model == nil {
		return p, invalid("model", "required")
	}
	p.Model = *in.Model
	if in.ServiceTier != nil {
		p.ServiceTier = *in.ServiceTier // the domain judges it (estimator.Price.Validate)
		if p.ServiceTier == "" {
			return p, invalid("service_tier", estimator.TierReason)
		}
	}
	if in.Currency != nil {
		p.Currency = *in.Currency
	}
	if in.EffectiveFrom != nil {
		t, err := time.Parse(time.RFC3339, *in.EffectiveFrom)
		if err != nil {
			return p, invalid("effective_from", "must be an RFC 3339 time")
		}
		p.EffectiveFrom = t
	}
	input, err := priceAmount(in.Input, "input", true)
	if err != nil {
		return p, err
	}
	output, err := priceAmount(in.Output, "output", true)
	if err != nil {
		return p, err
	}
	p.InputMicro, p.OutputMicro = *input, *output
	for _, o := range []struct {
		raw   json.RawMessage
		field string
		dst   **int64
	}{
		{in.CachedInput, "cached_input", &p.CachedInputMicro}, {in.CacheWrite5m, "cache_write_5m", &p.CacheWrite5mMicro},
		{in.CacheWrite1h, "cache_write_1h", &p.CacheWrite1hMicro}, {in.ReasoningOutput, "reasoning_output", &p.ReasoningOutputMicro},
	} {
		if *o.dst, err = priceAmount(o.raw, o.field, false); err != nil {
			return p, err
		}
	}
	if lc := in.LongContext; lc != nil {
		if lc.Threshold == nil {
			return p, invalid("long_context.threshold", "required")
		}
		p.LongContextThreshold = lc.Threshold
		if p.LongInputMicro, err = priceAmount(lc.Input, "long_context.input", true); err != nil {
			return p, err
		}
		if p.LongOutputMicro, err = priceAmount(lc.Output, "long_context.output", true); err != nil {
			return p, err
		}
	}
	return p, nil
}

// adminPriceCreate adds a price row, effective now or later, never in the
// past: a price change is a new row, so no route updates or deletes one.
// The row records the admin token's name as who made the change.
func (s *Server) adminPriceCreate(c *echo.Context) error {
	var in priceIn
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	p, err := in.price()
	if err != nil {
		return err
	}
	p.Source, p.CreatedBy = "api", actorOf(c)
	stored, err := s.admin.PriceAdd(c.Request().Context(), p) // an *estimator.InvalidError is a 400 naming the field
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, priceOf(stored))
}
