package api

import (
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/ledger"
)

// ledgerFilter reads the ledger filters of a query string.
func ledgerFilter(c *echo.Context) (ledger.Filter, error) {
	q := c.Request().URL.Query()
	order, err := enumParam(c, "order", "newest", "oldest")
	if err != nil {
		return ledger.Filter{}, err
	}
	f := ledger.Filter{TenantID: q.Get("tenant"), Kind: ledger.Kind(q.Get("kind")), Model: q.Get("model"),
		AdmissionID: q.Get("admission_id"), Actor: q.Get("actor"), Oldest: order == "oldest"}
	switch f.Kind {
	case "", ledger.KindReserve, ledger.KindSettle, ledger.KindRelease, ledger.KindExpire, ledger.KindAdjust, ledger.KindLimits, ledger.KindTenant,
		ledger.KindBatchReserve, ledger.KindBatchSettle, ledger.KindBatchRefund,
		ledger.KindLeaseTake, ledger.KindLeaseReturn:
	default:
		return f, invalid("kind", "must be one of reserve, settle, release, expire, adjust, limits, tenant, batch_reserve, batch_settle, batch_refund, lease_take, lease_return")
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
	// Money is what the entry moved in the deployment's currency, a
	// decimal exact to the micro-unit; absent for an entry of no priced
	// admission. Windows is every window's usage after it.
	Money   *json.Number `json:"money,omitempty"`
	Windows string       `json:"windows,omitempty"`
}

func entryOf(e *ledger.Entry) entryJSON {
	out := entryJSON{TenantID: e.TenantID, Seq: e.Seq, Kind: string(e.Kind), CreatedAt: e.CreatedAt, AdmissionID: e.AdmissionID,
		Model: e.Model, Estimate: e.Estimate, Actual: e.Actual, Refill: json.Number(ledger.Tokens(e.RefillMicro)),
		Delta: json.Number(ledger.Tokens(e.DeltaMicro)), Balance: json.Number(ledger.Tokens(e.BalanceMicro)),
		PeriodStart: e.PeriodStart, PeriodUsed: e.PeriodUsed, Late: e.Late, Actor: e.Actor, Reason: e.Reason,
		PrevHash: hex.EncodeToString(e.PrevHash), Hash: hex.EncodeToString(e.Hash), Windows: e.Windows}
	if e.MoneyMicro != nil {
		m := json.Number(ledger.Tokens(*e.MoneyMicro))
		out.Money = &m
	}
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
	entries, next, err := s.admin.LedgerQuery(c.Request().Context(), f)
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
//
// A 200 is a complete export. The first page's query runs before the status
// is sent, so a store that cannot answer is a JSON error like any other. A
// failure after rows went out can no longer change the status: the
// connection is broken off (http.ErrAbortHandler) without the chunked
// body's last chunk, so that every HTTP client reports a truncated body as
// an error (Go's io.ErrUnexpectedEOF, curl's exit 18) rather than a short
// file that looks whole.
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
	x, err := s.admin.LedgerExport(c.Request().Context(), f)
	if err != nil {
		return err
	}
	defer x.Close()
	h := c.Response().Header()
	h.Set("Cache-Control", "no-store")
	var write func() error
	if format == "csv" {
		h.Set("Content-Type", "text/csv; charset=utf-8")
		h.Set("Content-Disposition", `attachment; filename="tokengate-ledger.csv"`)
		write = func() error { return x.WriteCSV(c.Response()) }
	} else {
		h.Set("Content-Type", "application/x-ndjson")
		h.Set("Content-Disposition", `attachment; filename="tokengate-ledger.ndjson"`)
		write = func() error {
			enc := json.NewEncoder(c.Response())
			n := 0
			return x.Each(func(e *ledger.Entry) error {
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
		s.logger.Error("ledger export failed after its first rows: breaking the connection off", "error", err.Error())
		// What was written goes out first, so that the client has the
		// status and the rows, then a body that breaks.
		_ = http.NewResponseController(c.Response()).Flush()
		panic(http.ErrAbortHandler)
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
	entries, next, err := s.admin.LedgerQuery(c.Request().Context(), f)
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
	results, err := s.admin.LedgerVerify(c.Request().Context(), c.QueryParam("tenant"))
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
	by, err := enumParam(c, "by", "model")
	if err != nil {
		return err
	}
	p := account.DriftParams{TenantID: q.Get("tenant"), Model: q.Get("model"), ByModel: by == "model"}
	f, err := ledgerFilter(c) // the same from/to parsing
	if err != nil {
		return err
	}
	p.From, p.To = f.From, f.To
	if p.From.IsZero() {
		p.From = time.Now().Add(-24 * time.Hour)
	}
	rows, err := s.admin.DriftReport(c.Request().Context(), p)
	if err != nil {
		return err
	}
	if rows == nil {
		rows = []account.DriftRow{}
	}
	return c.JSON(http.StatusOK, map[string]any{"from": p.From, "to": p.To, "rows": rows})
}
