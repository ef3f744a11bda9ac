package proxy

import (
	"net/http"
	"strconv"
	"time"

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

// exhaustedMessage says which window is spent, how much of what, and
// when it resets: the same words on both wires.
func exhaustedMessage(e *rule.BudgetExhaustedError) string {
	of := ""
	if e.Level != "" {
		of = " of " + e.Level
	}
	return "the " + string(e.Counts) + " budget of window " + e.Window + of + " is exhausted: spent " + e.Amount(e.Spent) + " of " +
		e.Amount(e.Cap) + ", and this request needs " + e.Amount(e.Cost) + "; it resets at " + e.Resets.UTC().Format(time.RFC3339)
}
