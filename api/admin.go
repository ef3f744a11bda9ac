package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
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
// misspelt limit is an error, not a silent no-op.
func decodeStrict(c *echo.Context, v any) error {
	body, err := readBody(c)
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
	return nil
}

// limitsPatch is a partial set of limits: absent fields keep their value,
// null clears an optional limit. Rates are decimals, as numbers or strings.
type limitsPatch struct {
	TokensCapacity     *int64          `json:"tokens_capacity"`
	TokensPerSecond    json.RawMessage `json:"tokens_per_second"`
	RequestsCapacity   json.RawMessage `json:"requests_capacity"`
	RequestsPerSecond  json.RawMessage `json:"requests_per_second"`
	MaxConcurrent      json.RawMessage `json:"max_concurrent"`
	PeriodBudget       json.RawMessage `json:"period_budget"`
	Period             json.RawMessage `json:"period"`
	ReservationTTLMS   *int64          `json:"reservation_ttl_ms"`
	MaxWaitMS          *int64          `json:"max_wait_ms"`
	OnStoreUnavailable json.RawMessage `json:"on_store_unavailable"`
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

func rateField(raw json.RawMessage, field string, dst *int64) error {
	if raw == nil {
		return nil
	}
	if isNull(raw) {
		*dst = 0
		return nil
	}
	text := strings.Trim(string(bytes.TrimSpace(raw)), `"`)
	v, err := budget.ParseRate(text)
	if err != nil {
		return invalid(field, "must be a non-negative decimal with at most 6 places")
	}
	*dst = v
	return nil
}

func intField(raw json.RawMessage, field string, dst *int64) error {
	if raw == nil {
		return nil
	}
	if isNull(raw) {
		*dst = 0
		return nil
	}
	v, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
	if err != nil {
		return invalid(field, "must be an integer or null")
	}
	*dst = v
	return nil
}

// apply merges the patch into l.
func (p *limitsPatch) apply(l *budget.Limits) error {
	if p.TokensCapacity != nil {
		l.TokensCapacity = *p.TokensCapacity
	}
	if err := rateField(p.TokensPerSecond, "tokens_per_second", &l.TokensRateMicro); err != nil {
		return err
	}
	if err := intField(p.RequestsCapacity, "requests_capacity", &l.RequestsCapacity); err != nil {
		return err
	}
	if err := rateField(p.RequestsPerSecond, "requests_per_second", &l.RequestsRateMicro); err != nil {
		return err
	}
	if err := intField(p.MaxConcurrent, "max_concurrent", &l.MaxConcurrent); err != nil {
		return err
	}
	if err := intField(p.PeriodBudget, "period_budget", &l.PeriodBudget); err != nil {
		return err
	}
	if p.Period != nil {
		var period *string
		if err := json.Unmarshal(p.Period, &period); err != nil {
			return invalid("period", `must be "day", "month" or null`)
		}
		l.Period = budget.PeriodNone
		if period != nil {
			l.Period = budget.Period(*period)
		}
	}
	if p.ReservationTTLMS != nil {
		l.ReservationTTL = time.Duration(*p.ReservationTTLMS) * time.Millisecond
	}
	if p.MaxWaitMS != nil {
		if *p.MaxWaitMS < 1 {
			return invalid("max_wait_ms", "must be between 1 and 600000 (callers that do not send max_wait_ms never wait)")
		}
		l.MaxWait = time.Duration(*p.MaxWaitMS) * time.Millisecond
	}
	if p.OnStoreUnavailable != nil {
		var policy *string
		if err := json.Unmarshal(p.OnStoreUnavailable, &policy); err != nil {
			return invalid("on_store_unavailable", `must be "reject", "local" or null`)
		}
		l.OnStoreUnavailable = budget.PolicyDefault
		if policy != nil {
			l.OnStoreUnavailable = budget.Policy(*policy)
		}
	}
	if p.ReservationTTLMS != nil && *p.ReservationTTLMS < 1 {
		return invalid("reservation_ttl_ms", "must be between 1000 and 604800000")
	}
	return nil
}

func (s *Server) adminTenantList(c *echo.Context) error {
	snaps, err := s.budget.TenantList(c.Request().Context())
	if err != nil {
		return err
	}
	out := make([]budgetJSON, len(snaps))
	for i, snap := range snaps {
		out[i] = budgetOf(snap)
	}
	return c.JSON(http.StatusOK, map[string]any{"tenants": out})
}

func (s *Server) adminTenantCreate(c *echo.Context) error {
	var in struct {
		ID string `json:"id"`
		limitsPatch
	}
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	var l budget.Limits
	if err := in.apply(&l); err != nil {
		return err
	}
	snap, err := s.budget.CreateTenant(c.Request().Context(), budget.CreateTenantParams{ID: in.ID, Limits: l, Actor: actorOf(c)})
	if errors.Is(err, budget.ErrTenantExists) {
		return &Error{Status: http.StatusConflict, Type: "conflict", Field: "id", Message: "a tenant with this id exists"}
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, budgetOf(snap))
}

func (s *Server) adminTenantGet(c *echo.Context) error {
	snap, err := s.budget.TenantSnapshot(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, budgetOf(snap))
}

func (s *Server) adminTenantLimits(c *echo.Context) error {
	var in limitsPatch
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	ctx := c.Request().Context()
	cur, err := s.budget.TenantSnapshot(ctx, c.Param("id"))
	if err != nil {
		return err
	}
	l := cur.Limits
	if err := in.apply(&l); err != nil {
		return err
	}
	snap, err := s.budget.UpdateLimits(ctx, budget.UpdateLimitsParams{TenantID: c.Param("id"), Limits: l, Actor: actorOf(c)})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, budgetOf(snap))
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
	snap, err := s.budget.SetDisabled(c.Request().Context(), budget.SetDisabledParams{
		TenantID: c.Param("id"), Disabled: disabled, Reason: in.Reason, Actor: actorOf(c)})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, budgetOf(snap))
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
	snap, err := s.budget.Adjust(c.Request().Context(), budget.AdjustParams{
		TenantID: c.Param("id"), Tokens: *in.Tokens, Reason: in.Reason, Actor: actorOf(c)})
	if errors.Is(err, budget.ErrBadAdjustment) {
		return invalid("tokens", "must be a non-zero integer within ±1e12")
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, budgetOf(snap))
}

func (s *Server) tenantMustExist(c *echo.Context) error {
	_, err := s.budget.TenantSnapshot(c.Request().Context(), c.Param("id"))
	return err
}

func (s *Server) adminKeyList(c *echo.Context) error {
	if err := s.tenantMustExist(c); err != nil {
		return err
	}
	keys, err := credential.KeyList(c.Request().Context(), s.db, c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"keys": keys})
}

func (s *Server) adminKeyCreate(c *echo.Context) error {
	k, secret, err := credential.KeyCreateRecorded(c.Request().Context(), s.budget, c.Param("id"), actorOf(c))
	if errors.Is(err, credential.ErrTenantNotFound) {
		return budget.ErrTenantNotFound
	}
	if err != nil {
		return err
	}
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(http.StatusCreated, struct {
		credential.Key
		Secret string `json:"secret"`
		Note   string `json:"note"`
	}{k, secret, "the secret is shown once; only its SHA-256 is stored"})
}

func (s *Server) adminKeyRevoke(c *echo.Context) error {
	err := credential.KeyRevokeRecorded(c.Request().Context(), s.budget, c.Param("id"), c.Param("key"), actorOf(c))
	if errors.Is(err, credential.ErrKeyNotFound) {
		return &Error{Status: http.StatusNotFound, Type: "not_found", Message: "no such unrevoked key for this tenant"}
	}
	if err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

type modelJSON struct {
	Name                string      `json:"name"`
	Encoding            string      `json:"encoding"`
	InputWeight         json.Number `json:"input_weight"`
	OutputWeight        json.Number `json:"output_weight"`
	DefaultOutputTokens int64       `json:"default_output_tokens"`
	ContextWindow       int64       `json:"context_window"`
	PartTokens          int64       `json:"part_tokens"`
	OnStoreUnavailable  string      `json:"on_store_unavailable,omitempty"`
	Source              string      `json:"source"` // "seed" or "stored"
	UpdatedAt           *time.Time  `json:"updated_at,omitempty"`
	UpdatedBy           string      `json:"updated_by,omitempty"`
}

func (s *Server) adminModelList(c *echo.Context) error {
	stored, err := estimator.ModelList(c.Request().Context(), s.db)
	if err != nil {
		return err
	}
	byName := map[string]estimator.StoredModel{}
	for _, m := range stored {
		byName[m.Name] = m
	}
	table, err := estimator.LoadTable(c.Request().Context(), s.db)
	if err != nil {
		return err
	}
	var out []modelJSON
	for _, m := range table.Models() {
		j := modelJSON{Name: m.Name, Encoding: m.Encoding, InputWeight: json.Number(budget.FormatRate(m.InputWeightMicro)),
			OutputWeight: json.Number(budget.FormatRate(m.OutputWeightMicro)), DefaultOutputTokens: m.DefaultOutputTokens,
			ContextWindow: m.ContextWindow, PartTokens: m.PartTokens, OnStoreUnavailable: m.OnStoreUnavailable, Source: "seed"}
		if st, ok := byName[m.Name]; ok {
			j.Source, j.UpdatedAt, j.UpdatedBy = "stored", &st.UpdatedAt, st.UpdatedBy
		}
		out = append(out, j)
	}
	return c.JSON(http.StatusOK, map[string]any{"models": out})
}

type modelPatch struct {
	Name                *string         `json:"name"`
	Encoding            *string         `json:"encoding"`
	InputWeight         json.RawMessage `json:"input_weight"`
	OutputWeight        json.RawMessage `json:"output_weight"`
	DefaultOutputTokens *int64          `json:"default_output_tokens"`
	ContextWindow       *int64          `json:"context_window"`
	PartTokens          *int64          `json:"part_tokens"`
	OnStoreUnavailable  *string         `json:"on_store_unavailable"`
}

func (p *modelPatch) apply(m *estimator.Model) error {
	if p.Encoding != nil {
		m.Encoding = *p.Encoding
	}
	if err := rateField(p.InputWeight, "input_weight", &m.InputWeightMicro); err != nil {
		return err
	}
	if err := rateField(p.OutputWeight, "output_weight", &m.OutputWeightMicro); err != nil {
		return err
	}
	if p.DefaultOutputTokens != nil {
		m.DefaultOutputTokens = *p.DefaultOutputTokens
	}
	if p.ContextWindow != nil {
		m.ContextWindow = *p.ContextWindow
	}
	if p.PartTokens != nil {
		m.PartTokens = *p.PartTokens
	}
	if p.OnStoreUnavailable != nil {
		m.OnStoreUnavailable = *p.OnStoreUnavailable
	}
	return nil
}

// saveModel stores a model and applies the new table in this replica at
// once; other replicas pick it up at their next refresh.
// saveModel stores m, as a new model (create: the database refuses a name
// taken, even by another replica a moment ago) or over the stored one, and
// reloads this replica's table at once.
func (s *Server) saveModel(c *echo.Context, m estimator.Model, create bool) error {
	ctx := c.Request().Context()
	save, status := estimator.ModelUpsert, http.StatusOK
	if create {
		save, status = estimator.ModelInsert, http.StatusCreated
	}
	if err := save(ctx, s.db, m, actorOf(c)); err != nil {
		return err
	}
	table, err := estimator.LoadTable(ctx, s.db)
	if err != nil {
		return err
	}
	s.estimator.SetTable(table)
	return c.JSON(status, modelJSON{Name: m.Name, Encoding: m.Encoding, InputWeight: json.Number(budget.FormatRate(m.InputWeightMicro)),
		OutputWeight: json.Number(budget.FormatRate(m.OutputWeightMicro)), DefaultOutputTokens: m.DefaultOutputTokens,
		ContextWindow: m.ContextWindow, PartTokens: m.PartTokens, OnStoreUnavailable: m.OnStoreUnavailable, Source: "stored", UpdatedBy: actorOf(c)})
}

func (s *Server) adminModelCreate(c *echo.Context) error {
	var in modelPatch
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	if in.Name == nil {
		return invalid("name", "required")
	}
	if _, exists := s.estimator.Table().Get(*in.Name); exists {
		return &Error{Status: http.StatusConflict, Type: "conflict", Field: "name", Message: "a model with this name exists; PATCH /v1/admin/models/{name} changes it"}
	}
	m := estimator.Model{Name: *in.Name, Encoding: estimator.EncodingO200K, InputWeightMicro: estimator.WeightOne,
		OutputWeightMicro: estimator.WeightOne, DefaultOutputTokens: 16384, ContextWindow: 128000, PartTokens: 765}
	if err := in.apply(&m); err != nil {
		return err
	}
	return s.saveModel(c, m, true)
}

func (s *Server) adminModelUpdate(c *echo.Context) error {
	var in modelPatch
	if err := decodeStrict(c, &in); err != nil {
		return err
	}
	m, exists := s.estimator.Table().Get(c.Param("name"))
	if !exists {
		return &Error{Status: http.StatusNotFound, Type: "not_found", Message: "no such model; POST /v1/admin/models creates one"}
	}
	if in.Name != nil && *in.Name != m.Name {
		return invalid("name", "a model cannot be renamed")
	}
	if err := in.apply(&m); err != nil {
		return err
	}
	return s.saveModel(c, m, false)
}

// ledgerFilter reads the ledger filters of a query string.
func ledgerFilter(c *echo.Context) (ledger.Filter, error) {
	q := c.Request().URL.Query()
	f := ledger.Filter{TenantID: q.Get("tenant"), Kind: ledger.Kind(q.Get("kind")), Model: q.Get("model"),
		AdmissionID: q.Get("admission_id"), Actor: q.Get("actor"), Oldest: q.Get("order") == "oldest"}
	switch f.Kind {
	case "", ledger.KindReserve, ledger.KindSettle, ledger.KindRelease, ledger.KindExpire, ledger.KindAdjust, ledger.KindLimits, ledger.KindTenant:
	default:
		return f, invalid("kind", "must be one of reserve, settle, release, expire, adjust, limits, tenant")
	}
	for _, tf := range []struct {
		name string
		dst  *time.Time
	}{{"from", &f.From}, {"to", &f.To}} {
		if v := q.Get(tf.name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				if t, err = time.Parse("2006-01-02", v); err != nil {
					return f, invalid(tf.name, "must be an RFC 3339 time or a date (YYYY-MM-DD)")
				}
			}
			*tf.dst = t
		}
	}
	if v := q.Get("cursor"); v != "" {
		cur, err := ledger.ParseCursor(v)
		if err != nil {
			return f, invalid("cursor", "malformed cursor; use next_cursor from the previous page")
		}
		f.After = cur
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return f, invalid("limit", "must be between 1 and 1000")
		}
		f.Limit = n
	}
	return f, nil
}

type entryJSON struct {
	TenantID    string          `json:"tenant_id"`
	Seq         int64           `json:"seq"`
	Kind        string          `json:"kind"`
	CreatedAt   time.Time       `json:"created_at"`
	AdmissionID string          `json:"admission_id,omitempty"`
	Model       string          `json:"model,omitempty"`
	Estimate    *int64          `json:"estimate"`
	Actual      *int64          `json:"actual"`
	Refill      json.Number     `json:"refill"`
	Delta       json.Number     `json:"delta"`
	Balance     json.Number     `json:"balance"`
	PeriodStart *time.Time      `json:"period_start,omitempty"`
	PeriodUsed  int64           `json:"period_used"`
	Late        bool            `json:"late"`
	Actor       string          `json:"actor"`
	Reason      string          `json:"reason,omitempty"`
	Detail      json.RawMessage `json:"detail,omitempty"`
	PrevHash    string          `json:"prev_hash"`
	Hash        string          `json:"hash"`
}

func entryOf(e *ledger.Entry) entryJSON {
	rec := ledger.CSVRecord(e)
	out := entryJSON{TenantID: e.TenantID, Seq: e.Seq, Kind: string(e.Kind), CreatedAt: e.CreatedAt, AdmissionID: e.AdmissionID,
		Model: e.Model, Estimate: e.Estimate, Actual: e.Actual, Refill: json.Number(ledger.Tokens(e.RefillMicro)),
		Delta: json.Number(ledger.Tokens(e.DeltaMicro)), Balance: json.Number(ledger.Tokens(e.BalanceMicro)),
		PeriodStart: e.PeriodStart, PeriodUsed: e.PeriodUsed, Late: e.Late, Actor: e.Actor, Reason: e.Reason,
		PrevHash: rec[len(rec)-2], Hash: rec[len(rec)-1]}
	if e.Detail != "" && json.Valid([]byte(e.Detail)) {
		out.Detail = json.RawMessage(e.Detail)
	}
	return out
}

func (s *Server) adminLedger(c *echo.Context) error {
	f, err := ledgerFilter(c)
	if err != nil {
		return err
	}
	entries, next, err := ledger.EntryQuery(c.Request().Context(), s.db, f)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, pageOf(entries, next))
}

func (s *Server) adminLedgerExport(c *echo.Context) error {
	f, err := ledgerFilter(c)
	if err != nil {
		return err
	}
	return s.exportLedger(c, f)
}

// exportLedger streams every entry matching f, oldest first by default, as
// CSV or NDJSON, in constant memory: rows go out page by page as they are
// read.
func (s *Server) exportLedger(c *echo.Context, f ledger.Filter) error {
	format := c.QueryParam("format")
	if format == "" {
		format = "csv"
	}
	if format != "csv" && format != "ndjson" {
		return invalid("format", `must be "csv" or "ndjson"`)
	}
	if c.QueryParam("order") == "" {
		f.Oldest = true // auditors read from the first entry
	}
	h := c.Response().Header()
	h.Set("Cache-Control", "no-store")
	var write func() error
	if format == "csv" {
		h.Set("Content-Type", "text/csv; charset=utf-8")
		h.Set("Content-Disposition", `attachment; filename="tokengate-ledger.csv"`)
		write = func() error { return ledger.WriteCSV(c.Request().Context(), s.db, f, c.Response()) }
	} else {
		h.Set("Content-Type", "application/x-ndjson")
		h.Set("Content-Disposition", `attachment; filename="tokengate-ledger.ndjson"`)
		write = func() error {
			enc := json.NewEncoder(c.Response())
			n := 0
			return ledger.EntryEach(c.Request().Context(), s.db, f, func(e *ledger.Entry) error {
				if err := enc.Encode(entryOf(e)); err != nil {
					return err
				}
				if n++; n%1000 == 0 {
					if fl, ok := c.Response().(http.Flusher); ok {
						fl.Flush()
					}
				}
				return nil
			})
		}
	}
	c.Response().WriteHeader(http.StatusOK)
	if err := write(); err != nil {
		// The status is sent; a truncated body is the only signal left.
		s.logger.Error("ledger export failed", "error", err.Error())
	}
	return nil
}

// tenantLedger is GET /v1/ledger: a tenant reads its own ledger with its
// key (paged JSON, or an export with format=csv|ndjson), and no one else's.
func (s *Server) tenantLedger(c *echo.Context) error {
	q := c.Request().URL.Query()
	if q.Get("tenant") != "" && q.Get("tenant") != tenantOf(c) {
		return invalid("tenant", "a key reads only its own tenant's ledger")
	}
	f, err := ledgerFilter(c)
	if err != nil {
		return err
	}
	f.TenantID = tenantOf(c)
	if c.QueryParam("format") != "" {
		s.ensureRateHeaders(c)
		return s.exportLedger(c, f)
	}
	entries, next, err := ledger.EntryQuery(c.Request().Context(), s.db, f)
	if err != nil {
		return err
	}
	return s.respond(c, http.StatusOK, pageOf(entries, next), nil)
}

type ledgerPage struct {
	Entries    []entryJSON `json:"entries"`
	NextCursor *string     `json:"next_cursor"`
}

func pageOf(entries []ledger.Entry, next *ledger.Cursor) ledgerPage {
	out := ledgerPage{Entries: make([]entryJSON, len(entries))}
	for i := range entries {
		out.Entries[i] = entryOf(&entries[i])
	}
	if next != nil {
		cur := next.String()
		out.NextCursor = &cur
	}
	return out
}

// adminLedgerVerify recomputes every tenant's chain and balances (or one
// tenant's, with ?tenant=) and names the first broken entry of each.
func (s *Server) adminLedgerVerify(c *echo.Context) error {
	results, err := s.budget.Audit(c.Request().Context(), c.QueryParam("tenant"))
	if err != nil {
		return err
	}
	ok := true
	for _, r := range results {
		ok = ok && r.OK
	}
	return c.JSON(http.StatusOK, map[string]any{"ok": ok, "tenants": results})
}

func (s *Server) adminDriftReport(c *echo.Context) error {
	q := c.Request().URL.Query()
	p := budget.DriftParams{TenantID: q.Get("tenant"), Model: q.Get("model"), ByModel: q.Get("by") == "model"}
	f, err := ledgerFilter(c) // the same from/to parsing
	if err != nil {
		return err
	}
	p.From, p.To = f.From, f.To
	if p.From.IsZero() {
		p.From = time.Now().Add(-24 * time.Hour)
	}
	rows, err := s.budget.DriftReport(c.Request().Context(), p)
	if err != nil {
		return err
	}
	if rows == nil {
		rows = []budget.DriftRow{}
	}
	return c.JSON(http.StatusOK, map[string]any{"from": p.From, "to": p.To, "rows": rows})
}

func (s *Server) adminTokenList(c *echo.Context) error {
	tokens, err := credential.AdminTokenList(c.Request().Context(), s.db)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"tokens": tokens})
}

func (s *Server) adminTokenRevoke(c *echo.Context) error {
	err := credential.AdminTokenRevoke(c.Request().Context(), s.db, c.Param("id"))
	if errors.Is(err, credential.ErrAdminNotFound) {
		return &Error{Status: http.StatusNotFound, Type: "not_found", Message: "no such unrevoked admin token"}
	}
	if err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
