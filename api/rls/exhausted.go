package rls

import (
	"encoding/json"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokengate/tokengate/budget/rule"
)

// windowUnits are the rate limit units of the calendar windows.
var windowUnits = map[rule.WindowUnit]rlsv3.RateLimitResponse_RateLimit_Unit{
	rule.WindowHour: rlsv3.RateLimitResponse_RateLimit_HOUR, rule.WindowDay: rlsv3.RateLimitResponse_RateLimit_DAY,
	rule.WindowWeek: rlsv3.RateLimitResponse_RateLimit_WEEK, rule.WindowMonth: rlsv3.RateLimitResponse_RateLimit_MONTH,
}

// windowLimit is an exhausted window as a descriptor's current limit and
// remaining, in place of the token bucket's: named "window <name>
// (<tokens|currency>)", per the window's unit; a tokens window in cost
// units, a money window in whole units of its currency (rounded down: the
// headers and the body carry the exact decimals).
func windowLimit(e *rule.BudgetExhaustedError) (*rlsv3.RateLimitResponse_RateLimit, uint32) {
	ceiling, left := e.Cap, e.Remaining()
	if e.Counts == rule.CountMoney {
		ceiling, left = ceiling/rule.Micro, left/rule.Micro
	}
	unit := rlsv3.RateLimitResponse_RateLimit_UNKNOWN
	for _, w := range e.Snapshot.Limits.Windows {
		if w.Name == e.Window {
			unit = windowUnits[w.Unit]
		}
	}
	return &rlsv3.RateLimitResponse_RateLimit{Name: "window " + e.Window + " (" + e.Unit() + ")", RequestsPerUnit: clamp32(ceiling), Unit: unit}, clamp32(left)
}

// exhaustedBody is the HTTP API's error body for an exhausted window,
// which Envoy sends as the 429's body (raw_body).
type exhaustedBody struct {
	Error struct {
		Type         string                `json:"type"`
		Message      string                `json:"message"`
		Limit        string                `json:"limit"`
		Level        string                `json:"level,omitempty"`
		Window       string                `json:"window"`
		RetryAfterMS int64                 `json:"retry_after_ms"`
		Budget       *rule.ExhaustedBudget `json:"budget"`
	} `json:"error"`
}

// exhaustedResponse makes an OVER_LIMIT answer refused by an exhausted
// window say so, as the HTTP API does: the window's headers in place of
// the token bucket's x-ratelimit ones (whose remaining would read as
// room), x-should-retry: false, and the API's JSON error as the body.
func exhaustedResponse(resp *rlsv3.RateLimitResponse, e *rule.BudgetExhaustedError) {
	var h []*corev3.HeaderValue
	for _, x := range resp.ResponseHeadersToAdd {
		if !strings.HasPrefix(x.Key, "x-ratelimit-") {
			h = append(h, x) // retry-after: the longest wait of the call's refusals
		}
	}
	for _, rh := range e.RateHeaders() {
		h = append(h, &corev3.HeaderValue{Key: strings.ToLower(rh.Name), Value: rh.Value})
	}
	h = append(h, &corev3.HeaderValue{Key: "x-should-retry", Value: "false"}, &corev3.HeaderValue{Key: "content-type", Value: "application/json"})
	resp.ResponseHeadersToAdd = h

	var b exhaustedBody
	b.Error.Type, b.Error.Limit, b.Error.Level, b.Error.Window = "budget_exhausted", string(e.Limit), e.Level, e.Window
	b.Error.RetryAfterMS = rule.RetryAfterMillis(e.RetryAfter)
	b.Error.Message, b.Error.Budget = e.Message(), e.Amounts()
	resp.RawBody, _ = json.Marshal(b) // cannot fail: strings, numbers and a time
}
