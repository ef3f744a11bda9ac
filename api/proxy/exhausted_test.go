package proxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/rule"
)

// withMoneyWindow is a large token bucket (1,000,000, which must never
// read as room) with a daily money window of amount, in UTC.
func withMoneyWindow(t *testing.T, amount string) rule.Limits {
	t.Helper()
	ws, err := rule.ParseWindows([]rule.WindowJSON{{Name: "daily", Unit: "day", Money: &amount}})
	if err != nil {
		t.Fatal(err)
	}
	return rule.Limits{TokensCapacity: 1_000_000, TokensRateMicro: 1000 * rule.Micro, Windows: ws}
}

// price gives model a price per million tokens, from an hour ago.
func (b *bundle) price(t *testing.T, model string, in, out int64) {
	t.Helper()
	if _, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, effective_from, input_micro, output_micro, created_by)
		VALUES ($1, now() - interval '1 hour', $2, $3, 'test')`, model, in, out); err != nil {
		t.Fatal(err)
	}
}

// checkExhaustedHeaders: the headers of an exhausted money window are the
// window's, never the token bucket's, and say not to retry before its
// reset, which is midnight UTC.
func checkExhaustedHeaders(t *testing.T, h http.Header, spent, capacity string) {
	t.Helper()
	remaining, _ := rule.ParseRate(capacity)
	used, _ := rule.ParseRate(spent)
	for name, want := range map[string]string{
		"X-Should-Retry":                       "false",
		"X-Ratelimit-Limit-Budget":             capacity,
		"X-Ratelimit-Remaining-Budget":         rule.FormatRate(remaining - used),
		"X-Ratelimit-Budget-Window":            "daily",
		"X-Ratelimit-Budget-Unit":              "USD",
		"X-Ratelimit-Remaining-Tokens":         "",
		"Anthropic-Ratelimit-Tokens-Remaining": "",
	} {
		if got := h.Get(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	now := time.Now().UTC()
	reset := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	if ms := h.Get("Retry-After-Ms"); ms == "" || ms == "1" {
		t.Errorf("Retry-After-Ms %q", ms)
	}
	var secs int64
	if _, err := fmt.Sscan(h.Get("Retry-After"), &secs); err != nil || time.Duration(secs)*time.Second < time.Until(reset)-time.Minute ||
		time.Duration(secs)*time.Second > time.Until(reset)+time.Minute {
		t.Errorf("Retry-After %q, want the time to midnight UTC, %s", h.Get("Retry-After"), time.Until(reset))
	}
}

// On OpenAI's wire, a spent money window is OpenAI's own answer to a spent
// quota: 429 insufficient_quota naming the window, what it spent and its
// cap; the SDK, told x-should-retry: false, does not retry it (issue 36,
// item 5).
func TestOpenAIWireMoneyWindowExhaustedIsInsufficientQuota(t *testing.T) {
	t.Parallel()
	b := setup(t, withMoneyWindow(t, "0.0015"))
	b.price(t, "gpt-4o", 2_500_000, 10_000_000)
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":14,"completion_tokens":100,"total_tokens":114}}`)
	}
	// 14 in at 2.50 and 100 out at 10.00 per million: 0.001035 spent.
	if _, err := b.client.Chat.Completions.New(ctx, chatParams(100)); err != nil {
		t.Fatal(err)
	}
	retrying := openai.NewClient(option.WithBaseURL(b.base+"/v1/"), option.WithAPIKey(b.key), option.WithMaxRetries(3))
	actx, cancel := context.WithTimeout(ctx, 30*time.Second) // a retry would wait for the reset, hours away
	defer cancel()
	_, err := retrying.Chat.Completions.New(actx, chatParams(100))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Code != "insufficient_quota" || apiErr.Type != "insufficient_quota" {
		t.Fatalf("second call: %v", err)
	}
	for _, w := range []string{"window daily", "spent 0.001035 USD of 0.0015 USD", "resets at"} {
		if !strings.Contains(apiErr.Message, w) {
			t.Errorf("message %q does not say %q", apiErr.Message, w)
		}
	}
	checkExhaustedHeaders(t, apiErr.Response.Header, "0.001035", "0.0015")
	// One refusal: the SDK did not retry, and it is counted as a refusal
	// by period_budget, not as an error.
	if got := testutil.ToFloat64(b.admitter.Admissions(admission.FaceProxy, "rejected", "period_budget")); got != 1 {
		t.Errorf("%v refusals counted, want 1 (the SDK must not retry)", got)
	}
	if as := b.admissions(t); len(as) != 1 {
		t.Fatalf("%d admissions", len(as))
	}
}

// On Anthropic's wire, whose errors have no quota type, a spent money
// window is billing_error (402): documented, and retried by no SDK.
func TestAnthropicWireMoneyWindowExhaustedIsBillingError(t *testing.T) {
	t.Parallel()
	b := setup(t, withMoneyWindow(t, "0.012"))
	b.price(t, claudeModel, 3_000_000, 15_000_000)
	var h heard
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		h.add(r, body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,
			"usage":{"input_tokens":20,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":500}}`)
	}
	// 20 in at 3 and 500 out at 15 per million: 0.00756 spent.
	if _, err := b.anthropicClient(0).Messages.New(ctx, claudeParams(500, "Hello")); err != nil {
		t.Fatal(err)
	}
	// An SDK that retried would wait for the window's reset, hours away:
	// the deadline makes such a wait fail the test, not hang it.
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := b.anthropicClient(3).Messages.New(actx, claudeParams(500, "Hello"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("second call: %v", err)
	}
	var body struct {
		Type  string `json:"type"`
		Error struct{ Type, Message string }
	}
	if err := json.Unmarshal([]byte(apiErr.RawJSON()), &body); err != nil || body.Type != "error" || body.Error.Type != "billing_error" ||
		!strings.Contains(body.Error.Message, "budget_exhausted") || !strings.Contains(body.Error.Message, "window daily") ||
		!strings.Contains(body.Error.Message, "spent 0.00756 USD of 0.012 USD") {
		t.Fatalf("body %s: %v", apiErr.RawJSON(), err)
	}
	checkExhaustedHeaders(t, apiErr.Response.Header, "0.00756", "0.012")
	if got := testutil.ToFloat64(b.admitter.Admissions(admission.FaceProxy, "rejected", "period_budget")); got != 1 || h.count() != 1 {
		t.Errorf("%v refusals, %d upstream calls; want 1 and 1", got, h.count())
	}
}

// A wait refill can never end used to wrap around: an anthropic reset in
// the year 1734 and "Retry-After: 1". It has no reset and no retry-after,
// and says so (issue 36, P9).
func TestAnthropicWireHugeWaitSaysNever(t *testing.T) {
	t.Parallel()
	// A millionth of a token a second: 10,000 tokens short is 10^16 s.
	b := setup(t, rule.Limits{TokensCapacity: 50_000, TokensRateMicro: 1})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,
			"usage":{"input_tokens":20,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":20000}}`)
	}
	for range 2 {
		if _, err := b.anthropicClient(0).Messages.New(ctx, claudeParams(20_000, "Hello")); err != nil {
			t.Fatal(err)
		}
	}
	_, err := b.anthropicClient(0).Messages.New(ctx, claudeParams(20_000, "Hello"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || !strings.Contains(apiErr.RawJSON(), "refills too slowly") {
		t.Fatalf("refused: %v", err)
	}
	hd := apiErr.Response.Header
	if hd.Get("Retry-After") != "" || hd.Get("Retry-After-Ms") != "" || hd.Get("Anthropic-Ratelimit-Tokens-Reset") != "" || hd.Get("X-Should-Retry") != "false" {
		t.Fatalf("headers %v", hd)
	}
}
