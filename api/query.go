package api

import (
	"net/http"
	"slices"
	"sort"
	"strings"

	"github.com/labstack/echo/v5"
)

// ledgerParams are the filters ledgerFilter reads.
var ledgerParams = []string{"tenant", "kind", "model", "admission_id", "actor", "order", "from", "to", "cursor", "limit"}

// queryParams are the query parameters each route reads, by route path and
// method: the one place to audit them. A GET (or DELETE) with any other
// parameter is a 400 naming it and the ones the route accepts, so that a
// misspelled or invented filter (?group=day on a report) is refused, never
// silently ignored and answered as if it had been applied. A route absent
// from the table takes none.
var queryParams = map[string][]string{
	"GET /v1/ledger":                            append(slices.Clone(ledgerParams), "format"),
	"GET /v1/admin/ledger":                      ledgerParams,
	"GET /v1/admin/ledger/export":               {"tenant", "kind", "model", "admission_id", "actor", "order", "from", "to", "format"},
	"GET /v1/admin/ledger/verify":               {"tenant"},
	"GET /v1/admin/reports/drift":               {"tenant", "model", "by", "from", "to"},
	"GET /v1/admin/tenants/:id/end-users":       {"limit", "after"},
	"GET /v1/admin/alerts/rules":                {"tenant"},
	"GET /v1/admin/alerts/events":               {"tenant", "state", "endpoint", "limit"},
	"GET /v1/admin/prices":                      {"at", "model", "service_tier"},
	"DELETE /v1/admin/tenants/:id/model-limits": {"model"},
	"DELETE /v1/admin/pools/:pool/models":       {"model"},
	"GET /v1/admin/tenants/:id/model-limits":    nil,
	"GET /v1/admin/tenants/:id/batch-allowance": nil,
	"GET /v1/admin/tenants/:id/end-user-policy": nil,
	"GET /v1/admin/tenants/:id/tree":            nil,
	"GET /v1/admin/tenants/:id":                 nil,
	"GET /v1/admin/tenants/:id/keys":            nil,
	"GET /v1/admin/tenants":                     nil,
	"GET /v1/admin/alerts/endpoints":            nil,
	"GET /v1/admin/pools":                       nil,
	"GET /v1/admin/models":                      nil,
	"GET /v1/admin/prices/:model":               nil,
	"GET /v1/admin/tokens":                      nil,
	"GET /v1/admissions/:id":                    nil,
	"GET /v1/budget":                            nil,
}

// knownQuery refuses, on GET and DELETE routes, a query parameter the
// route does not read (queryParams).
func knownQuery(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c *echo.Context) error {
		m := c.Request().Method
		if m != http.MethodGet && m != http.MethodHead && m != http.MethodDelete {
			return next(c)
		}
		if m == http.MethodHead {
			m = http.MethodGet
		}
		known := queryParams[m+" "+c.Path()]
		q := c.Request().URL.Query()
		names := make([]string, 0, len(q))
		for name := range q {
			names = append(names, name)
		}
		sort.Strings(names) // the same parameter named whatever the map's order
		for _, name := range names {
			if !slices.Contains(known, name) {
				if len(known) == 0 {
					return invalid(name, "unknown query parameter: this route takes none")
				}
				return invalid(name, "unknown query parameter: this route takes "+strings.Join(known, ", "))
			}
		}
		return next(c)
	}
}

// enumParam is query parameter name, which must be "" (absent) or one of
// values: anything else is a 400 naming it and the values accepted.
func enumParam(c *echo.Context, name string, values ...string) (string, error) {
	v := c.QueryParam(name)
	if v == "" || slices.Contains(values, v) {
		return v, nil
	}
	return "", invalid(name, "unknown value "+quote(v)+": must be "+strings.Join(values, " or "))
}

// quote is v in double quotes, cut to 64 bytes: an error names the value
// it refuses without echoing a long one back.
func quote(v string) string {
	if len(v) > 64 {
		v = v[:64] + "…"
	}
	return `"` + strings.ReplaceAll(v, `"`, `\"`) + `"`
}
