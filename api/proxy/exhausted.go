package proxy

import (
	"net/http"
	"strconv"

	"github.com/tokengate/tokengate/budget/rule"
)

// setExhaustedHeaders sets, for an exhausted budget window, the headers
// of the window that bound (never the token bucket's, whose remaining
// would read as room), the wait to its reset, and x-should-retry: false:
// both wires' SDKs honour it, and no retry helps before the reset.
func setExhaustedHeaders(h http.Header, e *rule.BudgetExhaustedError) {
	for _, rh := range e.RateHeaders() {
		h.Set(rh.Name, rh.Value)
	}
	h.Set("Retry-After", strconv.FormatInt(rule.RetryAfterSeconds(e.RetryAfter), 10))
	h.Set("Retry-After-Ms", strconv.FormatInt(rule.RetryAfterMillis(e.RetryAfter), 10))
	h.Set("X-Should-Retry", "false")
}
