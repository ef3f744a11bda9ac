package rls_test

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
)

// tenant creates a tenant with limits and a gateway whose scope is it,
// and returns the gateway's credential.
func (b *bundle) tenant(t *testing.T, id string, l rule.Limits) string {
	t.Helper()
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: l}); err != nil {
		t.Fatal(err)
	}
	_, secret, err := credential.GatewayCreate(ctx, b.pool, "envoy-"+id, []string{id})
	if err != nil {
		t.Fatal(err)
	}
	return secret
}

// An exhausted money window through the rate limit service is OVER_LIMIT
// whose descriptor status, headers and body (raw_body, which Envoy sends
// as the 429's) name the window, what it spent and its cap, never the
// token bucket's remaining (issue 36, item 5).
func TestExhaustedMoneyWindowIsOverLimitWithTheWindowsHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// gpt-4o's input at 1.00 per million tokens: a hit costs 0.000001.
	if _, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, effective_from, input_micro, output_micro, created_by)
		VALUES ('gpt-4o', now() - interval '1 hour', 1000000, 1000000, 'test')`); err != nil {
		t.Fatal(err)
	}
	money := "0.001"
	ws, err := rule.ParseWindows([]rule.WindowJSON{{Name: "daily", Unit: "day", Money: &money}})
	if err != nil {
		t.Fatal(err)
	}
	gw := b.tenant(t, "moneyco", rule.Limits{TokensCapacity: 2_000_000, TokensRateMicro: 1000 * rule.Micro, Windows: ws})
	if r, err := b.call(t, gw, 600, desc("tenant", "moneyco", "model", "gpt-4o", "request_id", "one")); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first: %v %v", r, err)
	}
	r, err := b.call(t, gw, 600, desc("tenant", "moneyco", "model", "gpt-4o", "request_id", "two"))
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second: %v %v", r, err)
	}
	now := time.Now().UTC()
	untilReset := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC).Sub(now)
	st := r.Statuses[0]
	if st.Code != rlsv3.RateLimitResponse_OVER_LIMIT || st.CurrentLimit.GetName() != "window daily (USD)" ||
		st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY || st.LimitRemaining != 0 ||
		st.DurationUntilReset.AsDuration() < untilReset-time.Minute || st.DurationUntilReset.AsDuration() > untilReset+time.Minute {
		t.Fatalf("status %v, want the window's, resetting in %s", st, untilReset)
	}
	for key, want := range map[string]string{
		"x-ratelimit-limit-budget":     "0.001",
		"x-ratelimit-remaining-budget": "0.0004",
		"x-ratelimit-budget-window":    "daily",
		"x-ratelimit-budget-unit":      "USD",
		"x-should-retry":               "false",
		"retry-after":                  strconv.FormatInt(int64((st.DurationUntilReset.AsDuration()+time.Second-1)/time.Second), 10),
		// The bucket did not refuse: its 2,000,000 must not read as room.
		"x-ratelimit-remaining-tokens": "",
		"x-ratelimit-limit-tokens":     "",
	} {
		if got := header(r, key); got != want {
			t.Errorf("%s: %q, want %q", key, got, want)
		}
	}
	var body struct {
		Error struct {
			Type   string `json:"type"`
			Window string `json:"window"`
			Budget struct {
				Counts, Currency      string
				Spent, Cap, Remaining json.Number
				ResetsAt              time.Time `json:"resets_at"`
			} `json:"budget"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.RawBody, &body); err != nil || body.Error.Type != "budget_exhausted" || body.Error.Window != "daily" ||
		body.Error.Budget.Counts != "money" || body.Error.Budget.Currency != "USD" || body.Error.Budget.Spent != "0.0006" ||
		body.Error.Budget.Cap != "0.001" || body.Error.Budget.Remaining != "0.0004" {
		t.Fatalf("raw body %s: %v", r.RawBody, err)
	}
	if got := testutil.ToFloat64(b.admitter.Admissions(admission.FaceRLS, "rejected", "period_budget")); got != 1 {
		t.Errorf("%v refusals by period_budget counted, want 1", got)
	}
}

// A wait refill can never end has no duration_until_reset and no
// retry-after (it used to wrap to a negative one), and says not to retry
// (issue 36, P9).
func TestHugeWaitHasNoResetThroughTheRLS(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A millionth of a token a second: 10,000 tokens short is 10^16 s.
	gw := b.tenant(t, "slowco", rule.Limits{TokensCapacity: 50_000, TokensRateMicro: 1})
	if r, err := b.call(t, gw, 30_000, desc("tenant", "slowco", "request_id", "one")); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first: %v %v", r, err)
	}
	r, err := b.call(t, gw, 30_000, desc("tenant", "slowco", "request_id", "two"))
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second: %v %v", r, err)
	}
	if st := r.Statuses[0]; st.DurationUntilReset != nil || header(r, "retry-after") != "" || header(r, "x-ratelimit-reset-tokens") != "" ||
		header(r, "x-should-retry") != "false" {
		t.Fatalf("status %v headers %v", st, r.ResponseHeadersToAdd)
	}
}
