package web

import (
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/ledger"
)

// ledgerPageSize is how many entries one page of the browser shows.
const ledgerPageSize = 50

// ledgerKinds are the kinds the filter offers.
var ledgerKinds = []ledger.Kind{ledger.KindReserve, ledger.KindSettle, ledger.KindRelease, ledger.KindExpire,
	ledger.KindAdjust, ledger.KindLimits, ledger.KindTenant, ledger.KindBatchReserve, ledger.KindBatchSettle, ledger.KindBatchRefund,
	ledger.KindLeaseTake, ledger.KindLeaseReturn}

// filterFields are the ledger filter's query parameters (plus after, the
// page cursor).
var filterFields = []string{"tenant", "kind", "model", "admission", "actor", "from", "to"}

// parseFilter reads the filter from the query. Dates are UTC days
// (2006-01-02, "to" including its whole day) or RFC 3339 instants.
func parseFilter(q url.Values) (ledger.Filter, *form) {
	f := formFrom(q, append(slices.Clone(filterFields), "after")...)
	filter := ledger.Filter{
		TenantID:    f.Get("tenant"),
		Kind:        ledger.Kind(f.Get("kind")),
		Model:       f.Get("model"),
		AdmissionID: f.Get("admission"),
		Actor:       f.Get("actor"),
		Limit:       ledgerPageSize,
	}
	if filter.Kind != "" && !slices.Contains(ledgerKinds, filter.Kind) {
		f.Fail("kind", "is not a ledger entry kind")
	}
	filter.From = f.instant("from", false)
	filter.To = f.instant("to", true)
	if !filter.From.IsZero() && !filter.To.IsZero() && !filter.To.After(filter.From) {
		f.Fail("to", "must be after from")
	}
	if s := f.Get("after"); s != "" {
		c, err := ledger.ParseCursor(s)
		if err != nil {
			f.Fail("after", "is not a page cursor of this ledger; start from the first page")
		}
		filter.After = c
	}
	return filter, f
}

// instant parses a date (a UTC day; an end date means the end of that
// day) or an RFC 3339 time.
func (f *form) instant(name string, end bool) time.Time {
	s := f.Get(name)
	if s == "" {
		return time.Time{}
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		if end {
			t = t.AddDate(0, 0, 1)
		}
		return t
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC()
		}
	}
	f.Fail(name, "must be a date such as 2025-01-31 (UTC) or a time such as 2025-01-31T14:00:00Z")
	return time.Time{}
}

// query renders the filter's fields (not the cursor) as a query string.
func (f *form) query() url.Values {
	q := url.Values{}
	for _, n := range filterFields {
		if v := f.Get(n); v != "" {
			q.Set(n, v)
		}
	}
	return q
}

type ledgerView struct {
	layout
	Filter  *form
	Kinds   []ledger.Kind
	Entries entryTable
	Next    string
	First   string
	CSV     string
}

// ledgerPage lists entries newest first, a page at a time; the next page
// continues after the last entry's cursor (keyset paging), so entries
// written meanwhile never shift it.
func (d *Dashboard) ledgerPage(c *echo.Context) error {
	filter, f := parseFilter(c.QueryParams())
	q := f.query()
	v := &ledgerView{
		layout:  layout{Title: "Ledger", Nav: "ledger", Session: sessionOf(c)},
		Filter:  f,
		Kinds:   ledgerKinds,
		Entries: entryTable{ShowTenant: true},
		CSV:     "/ledger.csv?" + q.Encode(),
	}
	if !f.OK() {
		return d.render(c, http.StatusBadRequest, "ledger.html", v)
	}
	entries, next, err := d.admin.LedgerQuery(c.Request().Context(), filter)
	if err != nil {
		return err
	}
	v.Entries.Entries = entries
	if v.Entries.Currency, err = d.admin.PriceCurrency(c.Request().Context()); err != nil {
		return err
	}
	if next != nil {
		nq := f.query()
		nq.Set("after", next.String())
		v.Next = "/ledger?" + nq.Encode()
	}
	if filter.After != nil {
		v.First = "/ledger?" + q.Encode()
	}
	return d.render(c, http.StatusOK, "ledger.html", v)
}

// ledgerCSV streams every entry matching the filter (all pages) as a CSV
// attachment; memory stays flat however many rows match. As the API's
// export: the first query answers before the status is sent (a failure is
// an error page), and a failure after rows went out breaks the connection
// off, so that the browser reports a failed download instead of saving a
// short file.
func (d *Dashboard) ledgerCSV(c *echo.Context) error {
	filter, f := parseFilter(c.QueryParams())
	if !f.OK() {
		return pageErr(http.StatusBadRequest, "The export's filter is not valid: "+f.Problems()[0]+".")
	}
	filter.After = nil
	x, err := d.admin.LedgerExport(c.Request().Context(), filter)
	if err != nil {
		return err
	}
	defer x.Close()
	name := "tokengate-ledger-" + time.Now().UTC().Format("20060102T150405Z") + ".csv"
	h := c.Response().Header()
	h.Set("Content-Type", "text/csv; charset=utf-8")
	h.Set("Content-Disposition", `attachment; filename="`+name+`"`)
	c.Response().WriteHeader(http.StatusOK)
	if err := x.WriteCSV(c.Response()); err != nil {
		d.logger.ErrorContext(c.Request().Context(), "ledger export failed after its first rows: breaking the connection off", "error", err.Error(),
			"request_id", h.Get(echo.HeaderXRequestID))
		_ = http.NewResponseController(c.Response()).Flush() // the rows so far, then a body that breaks
		panic(http.ErrAbortHandler)
	}
	return nil
}
