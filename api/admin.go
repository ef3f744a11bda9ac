package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
)

const ctxAdmin = "tokengate.admin"

// requireAdmin authenticates an admin token (tga_...). Tenant keys are not
// admin tokens and are refused like any other wrong credential; failures
// draw on the same per-address limiter as tenant auth.
func (s *Server) requireAdmin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c *echo.Context) error {
		tok, err := s.guard.Admin(c.Request().Context(), c.RealIP(), bearer(c.Request()))
		if errors.Is(err, credential.ErrAdminInvalid) {
			return &Error{Status: http.StatusUnauthorized, Type: "unauthorized", Message: "missing or invalid admin token"}
		}
		if err != nil {
			return err
		}
		c.Set(ctxAdmin, tok)
		return next(c)
	}
}

// actorOf is the admin token's name, recorded as the actor of every change.
func actorOf(c *echo.Context) string {
	tok, _ := c.Get(ctxAdmin).(credential.AdminToken)
	return "admin:" + tok.Name
}

// decodeStrict decodes an admin request body, refusing unknown fields so a
// misspelt limit is an error, not a silent no-op, and anything after the one
// JSON value (a second value, trailing bytes) with a 400 naming "body".
func decodeStrict(c *echo.Context, v any) error {
	body, err := readTextBody(c)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var typ *json.UnmarshalTypeError
		var syn *json.SyntaxError
		switch {
		case errors.As(err, &typ):
			// Fields of an embedded patch struct carry its type name.
			return invalid(strings.TrimPrefix(typ.Field, "limitsPatch."), "must be "+jsonKind(typ.Type.Kind().String()))
		case errors.As(err, &syn):
			return invalid("body", "malformed JSON at byte "+strconv.FormatInt(syn.Offset, 10))
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			return invalid(strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`), "unknown field")
		}
		return invalid("body", "malformed JSON")
	}
	// One JSON value and nothing after it, as the tenant routes' decoder
	// requires: a second value or trailing bytes are not silently dropped.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return invalid("body", "trailing data after the JSON value at byte "+strconv.FormatInt(dec.InputOffset(), 10))
	}
	return nil
}

// limitsPatch is a partial set of limits as a client sends it: absent
// fields keep their value, null removes an optional limit (or restores a
// timing limit's default). Rates are decimals, as numbers or strings.
type limitsPatch struct {
	TokensCapacity     json.RawMessage `json:"tokens_capacity"`
	TokensPerSecond    json.RawMessage `json:"tokens_per_second"`
	RequestsCapacity   json.RawMessage `json:"requests_capacity"`
	RequestsPerSecond  json.RawMessage `json:"requests_per_second"`
	MaxConcurrent      json.RawMessage `json:"max_concurrent"`
	PeriodBudget       json.RawMessage `json:"period_budget"`
	Period             json.RawMessage `json:"period"`
	ReservationTTLMS   json.RawMessage `json:"reservation_ttl_ms"`
	MaxWaitMS          json.RawMessage `json:"max_wait_ms"`
	OnStoreUnavailable json.RawMessage `json:"on_store_unavailable"`
	// Shadow lists the limits evaluated and counted but never enforced
	// (null or [] enforces every limit).
	Shadow json.RawMessage `json:"shadow"`
	// Windows replaces the tenant's calendar windows (null or [] removes
	// them): rule.WindowJSON each.
	Windows json.RawMessage `json:"windows"`
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

func rateChange(raw json.RawMessage, field string) (rule.Change[int64], error) {
	switch {
	case raw == nil:
		return rule.Change[int64]{}, nil
	case isNull(raw):
		return rule.Unset[int64](), nil
	}
	text := string(bytes.TrimSpace(raw))
	if len(text) >= 2 && text[0] == '"' && text[len(text)-1] == '"' {
		text = text[1 : len(text)-1]
	}
	v, err := rule.ParseRate(text)
	if err != nil {
		return rule.Change[int64]{}, invalid(field, "must be a non-negative decimal with at most 6 places, or null")
	}
	return rule.Set(v), nil
}

func intChange(raw json.RawMessage, field string) (rule.Change[int64], error) {
	switch {
	case raw == nil:
		return rule.Change[int64]{}, nil
	case isNull(raw):
		return rule.Unset[int64](), nil
	}
	v, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
	if err != nil {
		return rule.Change[int64]{}, invalid(field, "must be an integer or null")
	}
	return rule.Set(v), nil
}

func rateField(raw json.RawMessage, field string, dst *int64) error {
	if raw == nil {
		return nil
	}
	if isNull(raw) {
		*dst = 0
		return nil
	}
	text := strings.Trim(string(bytes.TrimSpace(raw)), `"`)
	v, err := rule.ParseRate(text)
	if err != nil {
		return invalid(field, "must be a non-negative decimal with at most 6 places")
	}
	*dst = v
	return nil
}

func stringField[T ~string](raw json.RawMessage, field, want string) (rule.Change[T], error) {
	switch {
	case raw == nil:
		return rule.Change[T]{}, nil
	case isNull(raw):
		return rule.Unset[T](), nil
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return rule.Change[T]{}, invalid(field, want)
	}
	return rule.Set(T(v)), nil
}

// patch turns the client's fields into a rule.LimitsPatch, checked: each
// bad field is a 400 naming it.
func (p *limitsPatch) patch() (rule.LimitsPatch, error) {
	var out rule.LimitsPatch
	var err error
	for _, f := range []struct {
		raw  json.RawMessage
		name string
		dst  *rule.Change[int64]
		rate bool
	}{
		{p.TokensCapacity, "tokens_capacity", &out.TokensCapacity, false},
		{p.TokensPerSecond, "tokens_per_second", &out.TokensRateMicro, true},
		{p.RequestsCapacity, "requests_capacity", &out.RequestsCapacity, false},
		{p.RequestsPerSecond, "requests_per_second", &out.RequestsRateMicro, true},
		{p.MaxConcurrent, "max_concurrent", &out.MaxConcurrent, false},
		{p.PeriodBudget, "period_budget", &out.PeriodBudget, false},
		{p.ReservationTTLMS, "reservation_ttl_ms", &out.ReservationTTLMS, false},
		{p.MaxWaitMS, "max_wait_ms", &out.MaxWaitMS, false},
	} {
		if f.rate {
			*f.dst, err = rateChange(f.raw, f.name)
		} else {
			*f.dst, err = intChange(f.raw, f.name)
		}
		if err != nil {
			return out, err
		}
	}
	if out.Period, err = stringField[rule.Period](p.Period, "period", `must be "day", "month" or null`); err != nil {
		return out, err
	}
	if out.OnStoreUnavailable, err = stringField[rule.Policy](p.OnStoreUnavailable, "on_store_unavailable", `must be "reject", "local" or null`); err != nil {
		return out, err
	}
	switch {
	case p.Shadow == nil:
	case isNull(p.Shadow):
		out.Shadow = rule.Unset[rule.LimitSet]()
	default:
		var names []string
		if err := json.Unmarshal(p.Shadow, &names); err != nil {
			return out, invalid("shadow", "must be a list of limit names, or null")
		}
		set, err := rule.ParseLimitSet("shadow", names)
		if err != nil {
			return out, err
		}
		out.Shadow = rule.Set(set)
	}
	switch {
	case p.Windows == nil:
	case isNull(p.Windows):
		out.Windows = rule.Unset[[]rule.WindowLimit]()
	default:
		var js []rule.WindowJSON
		dec := json.NewDecoder(bytes.NewReader(p.Windows))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&js); err != nil {
			return out, invalid("windows", "must be a list of windows: {name, unit, time_zone, reset_at, week_start, tokens or money, overage_percent, thresholds}")
		}
		ws, err := rule.ParseWindows(js)
		if err != nil {
			return out, err
		}
		out.Windows = rule.Set(ws)
	}
	return out, out.Check()
}

func (s *Server) adminTenantList(c *echo.Context) error {
	snaps, err := s.admin.TenantList(c.Request().Context())
	if err != nil {
		return err
	}
	out := make([]budgetJSON, len(snaps))
	ptrs := make([]*budgetJSON, len(snaps))
	for i, snap := range snaps {
		out[i] = budgetOf(snap)
		ptrs[i] = &out[i]
	}
	if err := s.withSpend(c.Request().Context(), ptrs...); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"tenants": out})
}

func (s *Server) adminTenantCreate(c *echo.Context) error {
	var in struct {
		ID     string `json:"id"`
		Parent string `json:"parent"`
		limitsPatch
	}
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	patch, err := in.patch()
	if err != nil {
		return err
	}
	l := patch.Apply(rule.Limits{})
	snap, err := s.admin.TenantCreate(c.Request().Context(), account.CreateTenantParams{ID: in.ID, Parent: in.Parent, Limits: l, Actor: actorOf(c)})
	if errors.Is(err, rule.ErrTenantExists) {
		return &Error{Status: http.StatusConflict, Type: "conflict", Field: "id", Message: "a tenant with this id exists"}
	}
	if err != nil {
		return err
	}
	return s.adminBudget(c, http.StatusCreated, snap)
}

// treeJSON is a tenant and the tenants nested below it, each with its
// limits and balances.
type treeJSON struct {
	budgetJSON
	Children []*treeJSON `json:"children"`
}

// adminTenantTree renders the budget tree that holds a tenant, from its
// root: the organisation, its teams and their tenants, each with its own
// gauges.
func (s *Server) adminTenantTree(c *echo.Context) error {
	roots, err := s.admin.TenantTree(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	var all []*budgetJSON
	var render func(n *account.TreeNode) *treeJSON
	render = func(n *account.TreeNode) *treeJSON {
		out := &treeJSON{budgetJSON: budgetOf(n.Snapshot), Children: []*treeJSON{}}
		all = append(all, &out.budgetJSON)
		for _, ch := range n.Children {
			out.Children = append(out.Children, render(ch))
		}
		return out
	}
	root := render(roots)
	if err := s.withSpend(c.Request().Context(), all...); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, root)
}

func (s *Server) adminTenantGet(c *echo.Context) error {
	snap, err := s.admin.Tenant(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return s.adminBudget(c, http.StatusOK, snap)
}

func (s *Server) adminTenantLimits(c *echo.Context) error {
	var in limitsPatch
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	patch, err := in.patch()
	if err != nil {
		return err
	}
	snap, err := s.admin.TenantLimitsUpdate(c.Request().Context(), account.UpdateLimitsParams{TenantID: c.Param("id"), Patch: patch, Actor: actorOf(c)})
	if err != nil {
		return err
	}
	return s.adminBudget(c, http.StatusOK, snap)
}

func (s *Server) setDisabled(c *echo.Context, disabled bool) error {
	var in struct {
		Reason string `json:"reason"`
	}
	if c.Request().ContentLength != 0 {
		if err := decodeStrict(c, &in); err != nil {
			return err
		}
	}
	if len(in.Reason) > 500 {
		return invalid("reason", "at most 500 characters")
	}
	snap, err := s.admin.TenantSetDisabled(c.Request().Context(), account.SetDisabledParams{
		TenantID: c.Param("id"), Disabled: disabled, Reason: in.Reason, Actor: actorOf(c)})
	if err != nil {
		return err
	}
	return s.adminBudget(c, http.StatusOK, snap)
}

func (s *Server) adminTenantDisable(c *echo.Context) error { return s.setDisabled(c, true) }
func (s *Server) adminTenantEnable(c *echo.Context) error  { return s.setDisabled(c, false) }

func (s *Server) adminTenantAdjust(c *echo.Context) error {
	var in struct {
		Tokens *int64 `json:"tokens"`
		Reason string `json:"reason"`
	}
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	switch {
	case in.Tokens == nil || *in.Tokens == 0:
		return invalid("tokens", "required: a non-zero integer (positive credits, negative debits)")
	case strings.TrimSpace(in.Reason) == "" || len(in.Reason) > 500:
		return invalid("reason", "required: 1 to 500 characters")
	}
	snap, err := s.admin.TenantAdjust(c.Request().Context(), account.AdjustParams{
		TenantID: c.Param("id"), Tokens: *in.Tokens, Reason: in.Reason, Actor: actorOf(c)})
	if errors.Is(err, rule.ErrBadAdjustment) {
		return invalid("tokens", "required: a non-zero integer (positive credits, negative debits)")
	}
	if err != nil {
		return err
	}
	return s.adminBudget(c, http.StatusOK, snap)
}

// modelLimitsJSON is a tenant's limits for one model and their balances.
type modelLimitsJSON struct {
	Tenant                string       `json:"tenant"`
	Model                 string       `json:"model"`
	InputTokensCapacity   *int64       `json:"input_tokens_capacity"`
	InputTokensPerSecond  *json.Number `json:"input_tokens_per_second"`
	OutputTokensCapacity  *int64       `json:"output_tokens_capacity"`
	OutputTokensPerSecond *json.Number `json:"output_tokens_per_second"`
	Shadow                []string     `json:"shadow"`
	Balances              struct {
		InputTokens  *json.Number `json:"input_tokens"`
		OutputTokens *json.Number `json:"output_tokens"`
	} `json:"balances"`
	At time.Time `json:"at"`
}

func modelLimitsOf(m rule.ModelSnapshot) modelLimitsJSON {
	l := m.Limits
	out := modelLimitsJSON{Tenant: m.TenantID, Model: l.Model, Shadow: l.Shadow.Strings(), At: m.At}
	if l.InputCapacity > 0 {
		rate, bal := json.Number(rule.FormatRate(l.InputRateMicro)), json.Number(formatMicro(m.InputMicro))
		out.InputTokensCapacity, out.InputTokensPerSecond, out.Balances.InputTokens = &l.InputCapacity, &rate, &bal
	}
	if l.OutputCapacity > 0 {
		rate, bal := json.Number(rule.FormatRate(l.OutputRateMicro)), json.Number(formatMicro(m.OutputMicro))
		out.OutputTokensCapacity, out.OutputTokensPerSecond, out.Balances.OutputTokens = &l.OutputCapacity, &rate, &bal
	}
	return out
}

func (s *Server) adminModelLimitsList(c *echo.Context) error {
	list, err := s.admin.ModelLimitsList(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	out := make([]modelLimitsJSON, len(list))
	for i, m := range list {
		out[i] = modelLimitsOf(m)
	}
	return c.JSON(http.StatusOK, map[string]any{"model_limits": out})
}

// adminModelLimitsPut sets (creates or replaces) a tenant's limits for a
// model: the body is the whole set, an absent bucket is none. The model is
// in the body, not the path: model names may hold slashes.
func (s *Server) adminModelLimitsPut(c *echo.Context) error {
	var in struct {
		Model                 string          `json:"model"`
		InputTokensCapacity   int64           `json:"input_tokens_capacity"`
		InputTokensPerSecond  json.RawMessage `json:"input_tokens_per_second"`
		OutputTokensCapacity  int64           `json:"output_tokens_capacity"`
		OutputTokensPerSecond json.RawMessage `json:"output_tokens_per_second"`
		Shadow                []string        `json:"shadow"`
	}
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	l := rule.ModelLimits{Model: in.Model, InputCapacity: in.InputTokensCapacity, OutputCapacity: in.OutputTokensCapacity}
	if err := rateField(in.InputTokensPerSecond, "input_tokens_per_second", &l.InputRateMicro); err != nil {
		return err
	}
	if err := rateField(in.OutputTokensPerSecond, "output_tokens_per_second", &l.OutputRateMicro); err != nil {
		return err
	}
	var err error
	if l.Shadow, err = rule.ParseLimitSet("shadow", in.Shadow); err != nil {
		return err
	}
	snap, err := s.admin.ModelLimitsSet(c.Request().Context(), account.SetModelLimitsParams{TenantID: c.Param("id"), Limits: l, Actor: actorOf(c)})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, modelLimitsOf(snap))
}

func (s *Server) adminModelLimitsDelete(c *echo.Context) error {
	model := c.QueryParam("model")
	if model == "" {
		return invalid("model", "name the model: ?model=NAME")
	}
	if err := s.admin.ModelLimitsRemove(c.Request().Context(), c.Param("id"), model, actorOf(c)); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
