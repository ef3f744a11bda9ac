package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// settledOnce checks that acme has exactly one admission, settled at in
// and out, and that its balance is capacity less their cost (weights 1).
func (b *bundle) settledOnce(t *testing.T, capacity, in, out int64) *account.Admission {
	t.Helper()
	as := b.admissions(t)
	if len(as) != 1 || as[0].State != account.StateSettled {
		t.Fatalf("admissions %+v, want one settled", as)
	}
	a := as[0]
	if *a.ActualInput != in || *a.ActualOutput != out || *a.ActualCost != in+out {
		t.Fatalf("settled %d in, %d out, cost %d; want %d, %d, %d", *a.ActualInput, *a.ActualOutput, *a.ActualCost, in, out, in+out)
	}
	if got := b.balance(t); got != capacity-in-out {
		t.Fatalf("balance %d, want %d", got, capacity-in-out)
	}
	b.verify(t)
	return a
}

// P2 (issue 36): an honest one-hour cache write of 150 000 tokens fits the
// model's 200 000-token window, though its weight (2) makes it 300 000
// input tokens of budget: the usage bound counts raw tokens, the weight
// comes after. It was refused at the settle, and the call charged its
// small estimate.
func TestOneHourCacheWriteSettlesPastTheWindowInWeight(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 1_000_000, TokensRateMicro: 1})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Cached."}],
			"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":37,"cache_creation_input_tokens":150000,"cache_read_input_tokens":0,
			"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":150000},"output_tokens":200}}`)
	}
	if _, err := b.anthropicClient(0).Messages.New(ctx, claudeParams(1024, "Read this long document.")); err != nil {
		t.Fatal(err)
	}
	// 37 uncached + 150 000 x 2; 200 output.
	b.settledOnce(t, 1_000_000, 37+300_000, 200)
	if got := counterValue(t, b.reg, "settled"); got != 1 {
		t.Fatalf("settled %v, want 1 (not clamped, not failed)", got)
	}
}

// claudeImages is a Messages body of n images by URL (1 600 tokens each
// by the estimator's default) and a line of text.
func claudeImages(n int) string {
	var sb strings.Builder
	sb.WriteString(`{"model":"` + claudeModel + `","max_tokens":1024,"messages":[{"role":"user","content":[`)
	for i := range n {
		fmt.Fprintf(&sb, `{"type":"image","source":{"type":"url","url":"https://example.com/%d.png"}},`, i)
	}
	sb.WriteString(`{"type":"text","text":"Compare them."}]}]}`)
	return sb.String()
}

// P4 (issue 36): a Messages call with Anthropic's 1M-context beta, for a
// model that offers it, is estimated against the 1M window (a 208 000-token
// request is admitted, where without the beta it is refused at 200 000)
// and settled from its usage up to 1M (900 500 tokens, where it was
// clamped to 200 000); the header goes upstream as it came.
func TestContext1MBetaWidensTheWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 2_000_000, TokensRateMicro: 1})
	var calls atomic.Int64
	var beta atomic.Value
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		calls.Add(1)
		beta.Store(r.Header.Get("Anthropic-Beta"))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Done."}],
			"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":900000,"output_tokens":500}}`)
	}
	body := claudeImages(130)
	if status, out := b.postMessages(t, body); status != http.StatusBadRequest || !strings.Contains(out, "context window of 200000") {
		t.Fatalf("without the beta: %d %s", status, out)
	}
	if calls.Load() != 0 || len(b.admissions(t)) != 0 {
		t.Fatal("a call refused at the window reached the upstream or was admitted")
	}
	// A small call with the beta: its usage is bounded by the 1M window.
	const betas = "prompt-caching-2024-07-31, context-1m-2025-08-07"
	if status, out := b.postMessages(t, `{"model":"`+claudeModel+`","max_tokens":1024,"messages":[{"role":"user","content":"hi"}]}`,
		"Anthropic-Beta", betas); status != http.StatusOK {
		t.Fatalf("a small call with the beta: %d %s", status, out)
	}
	b.settledOnce(t, 2_000_000, 900_000, 500)
	if beta.Load() != betas {
		t.Fatalf("the upstream got anthropic-beta %q", beta.Load())
	}
	// The large one with the beta: admitted, and settled alike.
	if status, out := b.postMessages(t, body, "Anthropic-Beta", betas); status != http.StatusOK {
		t.Fatalf("with the beta: %d %s", status, out)
	}
	as := b.admissions(t)
	if len(as) != 2 || as[1].State != account.StateSettled || *as[1].ActualCost != 900_500 || as[1].Estimate.InputTokens < 130*1600 {
		t.Fatalf("the large call: %+v, want settled at 900 500 with an estimate of at least %d input tokens", as, 130*1600)
	}
	if got := b.balance(t); got != 2_000_000-2*900_500 {
		t.Fatalf("balance %d, want %d", got, 2_000_000-2*900_500)
	}
	// count_tokens counts it too, with the beta.
	req, _ := http.NewRequest(http.MethodPost, b.base+"/v1/messages/count_tokens", strings.NewReader(body))
	req.Header.Set("X-Api-Key", b.key)
	req.Header.Set("Anthropic-Beta", "context-1m-2025-08-07")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"input_tokens"`) {
		t.Fatalf("count_tokens with the beta: %d %s", resp.StatusCode, raw)
	}
}

// P5 (issue 36): OpenAI reads its JSON keys case-sensitively, so a
// stream_options (or include_usage) spelled in another case asks for no
// usage upstream: the proxy must ask for it itself (and keep the chunk
// from the client, which did not ask by OpenAI's name), and settle from
// it: 4 000 output tokens, where it charged the 52 it counted.
func TestStreamOptionsInAnotherCaseStillSettlesFromUsage(t *testing.T) {
	t.Parallel()
	for i, options := range []string{`"Stream_Options":{"include_usage":true}`, `"stream_options":{"Include_Usage":true}`} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
			b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
				// OpenAI's rule: the usage chunk only for stream_options.include_usage, by those names.
				w.Header().Set("Content-Type", "text/event-stream")
				events := []string{chatChunk(strings.Repeat("All work and no play. ", 10))}
				if so, _ := body["stream_options"].(map[string]any); so["include_usage"] == true {
					events = append(events, `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":4000,"total_tokens":4020}}`)
				}
				writeSSE(w, append(events, "[DONE]")...)
			}
			status, _, out := b.post(t, `{"model":"gpt-4o","max_tokens":5000,"stream":true,`+options+`,"messages":[{"role":"user","content":"Write."}]}`)
			if status != http.StatusOK || strings.Contains(out, `"usage"`) || !strings.Contains(out, "[DONE]") {
				t.Fatalf("%d %s", status, out)
			}
			b.settledOnce(t, 100_000, 20, 4000)
		})
	}
}

// P5 (issue 36): a stream whose upstream sends no usage is settled from
// what it streamed, and that is everything the model wrote: its text, a
// refusal, and its tool calls' names and arguments (chat's tool_calls and
// the legacy function_call; the Responses API's function call arguments
// and refusal deltas), counted with the model's encoding.
func TestStreamWithoutUsageCountsToolCallsAndRefusals(t *testing.T) {
	t.Parallel()
	args := `{"cities": [` + strings.Repeat(`"Paris", "Rome", `, 300) + `"Oslo"]}`
	var pieces []string
	for s := args; s != ""; {
		n := min(len(s), 40)
		pieces, s = append(pieces, s[:n]), s[n:]
	}
	count := func(t *testing.T, parts ...string) int64 {
		n, err := estimator.CountText(estimator.EncodingO200K, strings.Join(parts, ""))
		if err != nil {
			t.Fatal(err)
		}
		return int64(n)
	}
	t.Run("chat", func(t *testing.T) {
		t.Parallel()
		b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
		b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
			w.Header().Set("Content-Type", "text/event-stream")
			events := []string{chatChunk("Let me look that up."),
				`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}`}
			for _, p := range pieces {
				events = append(events, fmt.Sprintf(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":%q}}]},"finish_reason":null}]}`, p))
			}
			events = append(events,
				`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"function_call":{"name":"lookup","arguments":"{\"q\": \"forecast\"}"}},"finish_reason":null}]}`,
				`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"refusal":"I can't share the forecast for that place."},"finish_reason":"stop"}]}`,
				"[DONE]")
			writeSSE(w, events...) // and never a usage chunk, whatever it was asked
		}
		status, _, out := b.post(t, `{"model":"gpt-4o","max_tokens":5000,"stream":true,"messages":[{"role":"user","content":"Weather?"}]}`)
		if status != http.StatusOK {
			t.Fatalf("%d %s", status, out)
		}
		want := count(t, append(append([]string{"Let me look that up.", "get_weather"}, pieces...),
			"lookup", `{"q": "forecast"}`, "I can't share the forecast for that place.")...)
		if want < 1000 {
			t.Fatalf("the test's tool call counts %d tokens: too few to matter", want)
		}
		in := b.admissions(t)[0].Estimate.InputTokens
		b.settledOnce(t, 100_000, in, want)
	})
	t.Run("responses", func(t *testing.T) {
		t.Parallel()
		b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
		b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
			w.Header().Set("Content-Type", "text/event-stream")
			events := []string{`{"type":"response.created","response":{"id":"r1","status":"in_progress","usage":null}}`,
				`{"type":"response.output_text.delta","item_id":"m1","output_index":0,"content_index":0,"delta":"Checking."}`}
			for _, p := range pieces {
				events = append(events, fmt.Sprintf(`{"type":"response.function_call_arguments.delta","item_id":"fc1","output_index":1,"delta":%q}`, p))
			}
			events = append(events, `{"type":"response.refusal.delta","item_id":"m2","output_index":2,"content_index":0,"delta":"I won't."}`,
				`{"type":"response.completed","response":{"id":"r1","status":"completed","usage":null}}`)
			writeSSE(w, events...)
		}
		status, _, out := b.postTo(t, "/v1/responses", `{"model":"gpt-4o","max_output_tokens":5000,"stream":true,"input":"Weather?"}`)
		if status != http.StatusOK {
			t.Fatalf("%d %s", status, out)
		}
		want := count(t, append(append([]string{"Checking."}, pieces...), "I won't.")...)
		in := b.admissions(t)[0].Estimate.InputTokens
		b.settledOnce(t, 100_000, in, want)
	})
}

// P11 (issue 36): Anthropic's message_delta usage is cumulative, so a
// field it gives as 0 (input_tokens, and the cache's) never erases what
// message_start said: 4 000 input tokens stay 4 000, where they were
// settled as 0. A later, larger total still counts.
func TestMessageDeltaZeroKeepsMessageStartInput(t *testing.T) {
	t.Parallel()
	start := `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[],"stop_reason":null,"stop_sequence":null,` +
		`"usage":{"input_tokens":4000,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}`
	for _, tc := range []struct {
		delta   string
		in, out int64
	}{
		{`{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":15}`, 4000, 15},
		// Totals restated and grown: 1 000 cache reads at 0.1.
		{`{"input_tokens":4000,"cache_read_input_tokens":1000,"output_tokens":15}`, 4100, 15},
	} {
		t.Run(tc.delta, func(t *testing.T) {
			t.Parallel()
			b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
			b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
				w.Header().Set("Content-Type", "text/event-stream")
				sse(w, start, `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
					textDelta("Hello."), `{"type":"content_block_stop","index":0}`,
					`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":`+tc.delta+`}`,
					`{"type":"message_stop"}`)
			}
			status, out := b.postMessages(t, `{"model":"`+claudeModel+`","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"Say hello."}]}`)
			if status != http.StatusOK || !strings.Contains(out, "message_stop") {
				t.Fatalf("%d %s", status, out)
			}
			b.settledOnce(t, 100_000, tc.in, tc.out)
		})
	}
}
