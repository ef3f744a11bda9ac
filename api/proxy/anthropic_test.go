package proxy_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/tokengate/tokengate/api/proxy"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// claudeModel is a seeded Claude family: weights 1, cache reads 0.1, cache
// writes 1.25 (5 min) and 2 (1 h), the older tokenizer's factor 1.25.
const claudeModel = "claude-sonnet-4-5-20250929"

// anthropicClient is Anthropic's SDK pointed at the proxy with the
// tenant's key, as Claude Code is with ANTHROPIC_BASE_URL.
func (b *bundle) anthropicClient(retries int) *anthropic.Client {
	c := anthropic.NewClient(aoption.WithBaseURL(b.base+"/"), aoption.WithAPIKey(b.key), aoption.WithMaxRetries(retries))
	return &c
}

func claudeParams(max int64, text string) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{Model: claudeModel, MaxTokens: max,
		System:   []anthropic.TextBlockParam{{Text: "You are terse."}},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(text))}}
}

// heard is what the emulated Anthropic upstream received.
type heard struct {
	mu      sync.Mutex
	headers []http.Header
	bodies  [][]byte
}

func (h *heard) add(r *http.Request, body map[string]any) {
	raw, _ := json.Marshal(body)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.headers = append(h.headers, r.Header.Clone())
	h.bodies = append(h.bodies, raw)
}

func (h *heard) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.headers)
}

const claudeAnswer = `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Hello, platform team!"}],
	"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":100,"cache_creation_input_tokens":200,"cache_read_input_tokens":1000,
	"cache_creation":{"ephemeral_5m_input_tokens":50,"ephemeral_1h_input_tokens":150},"output_tokens":40}}`

// claudeAnswerCost is claudeAnswer's usage at the model's weights: 100
// uncached + ceil(1000 x 0.1 + 50 x 1.25 + 150 x 2) = 563 input, 40 output.
const claudeAnswerInput, claudeAnswerOutput = 563, 40

// balance is the tenant's token balance now (its refill is negligible in
// these tests: one micro unit per second).
func (b *bundle) balance(t *testing.T) int64 {
	t.Helper()
	snap, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	return snap.Tokens()
}

// TestMessagesSettlesCacheUsageExactly: the SDK's call is admitted,
// forwarded with tokengate's Anthropic key (never the tenant's, neither
// as x-api-key nor as a bearer token) and the client's anthropic-version
// and anthropic-beta, and settled from Anthropic's usage: cache reads at
// 0.1, 5 minute writes at 1.25, 1 hour writes at 2, to the exact token in
// the admission, the ledger and the balance.
func TestMessagesSettlesCacheUsageExactly(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	var h heard
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		h.add(r, body)
		if r.URL.Path != "/v1/messages" {
			t.Errorf("upstream path %s", r.URL.Path)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Anthropic-Ratelimit-Tokens-Remaining", "999999") // the organisation's: not the tenant's business
		fmt.Fprint(w, claudeAnswer)
	}
	client := b.anthropicClient(0)
	msg, err := client.Messages.New(ctx, claudeParams(1024, "Say hello to the platform team."),
		aoption.WithHeader("anthropic-beta", "extended-cache-ttl-2025-04-11"))
	if err != nil {
		t.Fatal(err)
	}
	if msg.Content[0].Text != "Hello, platform team!" || msg.Usage.CacheReadInputTokens != 1000 {
		t.Fatalf("answer: %+v", msg)
	}
	// The same call with the key as a bearer token (Claude Code's
	// ANTHROPIC_AUTH_TOKEN).
	req, _ := http.NewRequest(http.MethodPost, b.base+"/v1/messages",
		strings.NewReader(`{"model":"`+claudeModel+`","max_tokens":1024,"messages":[{"role":"user","content":"Say hello to the platform team."}]}`))
	req.Header.Set("Authorization", "Bearer "+b.key)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Anthropic-Ratelimit-Tokens-Remaining") == "999999" ||
		resp.Header.Get("Anthropic-Ratelimit-Tokens-Limit") != "100000" || resp.Header.Get("X-Tokengate-Admission") == "" {
		t.Fatalf("bearer call: %d %v %s", resp.StatusCode, resp.Header, raw)
	}
	for i, hd := range h.headers {
		if hd.Get("X-Api-Key") != "sk-ant-upstream" || hd.Get("Authorization") != "" || hd.Get("Anthropic-Version") == "" {
			t.Fatalf("call %d: the upstream got x-api-key %q, authorization %q, anthropic-version %q", i, hd.Get("X-Api-Key"), hd.Get("Authorization"), hd.Get("Anthropic-Version"))
		}
		for name, vs := range hd {
			for _, v := range vs {
				if strings.Contains(v, b.key) {
					t.Fatalf("call %d: the tenant's key reached the upstream in %s", i, name)
				}
			}
		}
	}
	if got := h.headers[0].Get("Anthropic-Beta"); got != "extended-cache-ttl-2025-04-11" {
		t.Fatalf("anthropic-beta: %q", got)
	}
	if got := h.headers[1].Get("Anthropic-Version"); got != "2023-06-01" {
		t.Fatalf("the raw call's anthropic-version: %q", got)
	}
	as := b.admissions(t)
	if len(as) != 2 {
		t.Fatalf("%d admissions", len(as))
	}
	var spent int64
	for _, a := range as {
		if a.State != account.StateSettled || *a.ActualInput != claudeAnswerInput || *a.ActualOutput != claudeAnswerOutput ||
			*a.ActualCost != claudeAnswerInput+claudeAnswerOutput || !a.Estimate.Approximate || a.Estimate.OutputTokens != 1024 {
			t.Fatalf("admission: %+v (estimate %+v)", a, a.Estimate)
		}
		spent += *a.ActualCost
	}
	if got := b.balance(t); got != 100_000-spent {
		t.Fatalf("balance %d, want %d", got, 100_000-spent)
	}
	b.verify(t)
}

// sse writes Anthropic's named events.
func sse(w http.ResponseWriter, events ...string) {
	for _, e := range events {
		var v struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal([]byte(e), &v)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", v.Type, e)
		w.(http.Flusher).Flush()
	}
}

const messageStart = `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[],"stop_reason":null,"stop_sequence":null,` +
	`"usage":{"input_tokens":100,"cache_creation_input_tokens":200,"cache_read_input_tokens":1000,"output_tokens":1}}}`

func textDelta(s string) string {
	return fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, s)
}

// streamInput is messageStart's usage at the model's weights: 100 +
// ceil(1000 x 0.1 + 200 x 1.25) = 450 (no split: every write at 5 min).
const streamInput = 450

// TestMessagesStreamed: a stream's events are relayed as they come (the
// ping too) and it settles from message_start's input and cache usage and
// message_delta's output, before message_stop reaches the client.
func TestMessagesStreamed(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		if body["stream"] != true {
			t.Errorf("not asked to stream: %v", body)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		sse(w, messageStart, `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`, `{"type":"ping"}`,
			textDelta("Hello"), textDelta(", platform team!"), `{"type":"content_block_stop","index":0}`,
			`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}`)
		sse(w, `{"type":"message_stop"}`)
	}
	stream := b.anthropicClient(0).Messages.NewStreaming(ctx, claudeParams(1024, "Say hello."))
	var msg anthropic.Message
	types := []string{}
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		if err := msg.Accumulate(ev); err != nil {
			t.Fatal(err)
		}
		if ev.Type == "message_stop" {
			// The budget is settled before the stream's end reaches the client.
			if a := b.admissions(t); len(a) != 1 || a[0].State != account.StateSettled {
				t.Fatalf("at message_stop: %+v", a)
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if msg.Content[0].Text != "Hello, platform team!" || msg.Usage.OutputTokens != 15 ||
		strings.Join(types, ",") != "message_start,content_block_start,content_block_delta,content_block_delta,content_block_stop,message_delta,message_stop" {
		t.Fatalf("streamed %v: %+v", types, msg)
	}
	// The SDK skips pings: the wire shows every event, named, in order.
	req, _ := http.NewRequest(http.MethodPost, b.base+"/v1/messages",
		strings.NewReader(`{"model":"`+claudeModel+`","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"Say hello."}]}`))
	req.Header.Set("X-Api-Key", b.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var names []string
	for _, line := range strings.Split(string(raw), "\n") {
		if name, ok := strings.CutPrefix(line, "event: "); ok {
			names = append(names, name)
		}
	}
	if strings.Join(names, ",") != "message_start,content_block_start,ping,content_block_delta,content_block_delta,content_block_stop,message_delta,message_stop" {
		t.Fatalf("on the wire: %v", names)
	}
	as := b.admissions(t)
	for _, a := range as {
		if *a.ActualInput != streamInput || *a.ActualOutput != 15 || *a.ActualCost != streamInput+15 {
			t.Fatalf("admission: %+v", a)
		}
	}
	if got := b.balance(t); len(as) != 2 || got != 100_000-2*(streamInput+15) {
		t.Fatalf("%d admissions, balance %d, want %d", len(as), got, 100_000-2*(streamInput+15))
	}
	b.verify(t)
}

// TestMessagesCountTokens: count_tokens is answered from the estimator
// (the input a call of the same body would reserve), never reaches the
// upstream and never debits.
func TestMessagesCountTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	calls := 0
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) { calls++ }
	res, err := b.anthropicClient(0).Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: claudeModel,
		System:   anthropic.MessageCountTokensParamsSystemUnion{OfString: anthropic.String("You are terse.")},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("How many tokens is this?"))}})
	if err != nil {
		t.Fatal(err)
	}
	req, err := estimator.ParseMessages([]byte(`{"model":"` + claudeModel + `","max_tokens":1,"system":"You are terse.","messages":[{"role":"user","content":[{"type":"text","text":"How many tokens is this?"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want, err := b.est.Estimate(req)
	if err != nil {
		t.Fatal(err)
	}
	if res.InputTokens != want.InputTokens || res.InputTokens < 10 {
		t.Fatalf("count_tokens %d, want the estimate's %d", res.InputTokens, want.InputTokens)
	}
	// A bad body is Anthropic's invalid_request_error; a bad key its
	// authentication_error.
	_, err = b.anthropicClient(0).Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: claudeModel})
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.RawJSON(), `"invalid_request_error"`) {
		t.Fatalf("no messages: %v", err)
	}
	bad := anthropic.NewClient(aoption.WithBaseURL(b.base+"/"), aoption.WithAPIKey("tg_nosuchkey_0000"), aoption.WithMaxRetries(0))
	_, err = bad.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: claudeModel,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("x"))}})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized || !strings.Contains(apiErr.RawJSON(), `"authentication_error"`) {
		t.Fatalf("bad key: %v", err)
	}
	if calls != 0 || len(b.admissions(t)) != 0 || b.balance(t) != 100_000 {
		t.Fatalf("count_tokens reached the upstream %d times, admitted %d, balance %d", calls, len(b.admissions(t)), b.balance(t))
	}
	b.verify(t)
}

func pngData(t *testing.T, w, h int) string {
	t.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}

// TestMessagesToolsAndImages: tools, a tool_use and its tool_result, and
// images go through; the reservation is the estimator's count of the very
// body the upstream received (a base64 image by its size, a URL image at
// the model's default), and the call settles from its usage.
func TestMessagesToolsAndImages(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	var h heard
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		h.add(r, body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"msg_2","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"tool_use","id":"t2","name":"weather","input":{"city":"Oslo"}}],
			"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":2100,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":30}}`)
	}
	tool := anthropic.ToolParam{Name: "weather", Description: anthropic.String("The weather in a city"),
		InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"city": map[string]any{"type": "string"}}, Required: []string{"city"}}}
	p := anthropic.MessageNewParams{Model: claudeModel, MaxTokens: 500, Tools: []anthropic.ToolUnionParam{{OfTool: &tool}},
		Messages: []anthropic.MessageParam{
			anthropic.NewUserMessage(anthropic.NewTextBlock("What is in these pictures, and the weather in Paris?"),
				anthropic.NewImageBlockBase64("image/png", pngData(t, 600, 400)),
				anthropic.NewImageBlock(anthropic.URLImageSourceParam{URL: "https://example.com/cat.png"})),
			anthropic.NewAssistantMessage(anthropic.NewToolUseBlock("t1", map[string]any{"city": "Paris"}, "weather")),
			anthropic.NewUserMessage(anthropic.NewToolResultBlock("t1", "Sunny, 21 C", false)),
		}}
	msg, err := b.anthropicClient(0).Messages.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if msg.StopReason != "tool_use" || msg.Content[0].Name != "weather" {
		t.Fatalf("answer: %+v", msg)
	}
	req, err := estimator.ParseMessages(h.bodies[0])
	if err != nil {
		t.Fatal(err)
	}
	want, err := b.est.Estimate(req)
	if err != nil {
		t.Fatal(err)
	}
	a := b.admissions(t)[0]
	// 600x400 is 320 tokens; the URL image 1600; the tool prompt 346.
	if a.Estimate.InputTokens != want.InputTokens || a.Estimate.InputTokens < 320+1600+346 || *a.ActualInput != 2100 || *a.ActualOutput != 30 {
		t.Fatalf("admission %+v, estimate %+v; want the estimate's input %d", a, a.Estimate, want.InputTokens)
	}
	var sent struct {
		Tools    []map[string]any `json:"tools"`
		Messages []struct {
			Content []map[string]any `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(h.bodies[0], &sent); err != nil || len(sent.Tools) != 1 || sent.Tools[0]["input_schema"] == nil ||
		len(sent.Messages) != 3 || sent.Messages[0].Content[1]["type"] != "image" || sent.Messages[2].Content[0]["type"] != "tool_result" {
		t.Fatalf("the upstream got %s (%v)", h.bodies[0], err)
	}
	b.verify(t)
}

// TestMessagesRefusalAndTheSDKRetries: over the allowance the proxy answers
// Anthropic's 429 rate_limit_error with retry-after and the
// anthropic-ratelimit headers, charging nothing; the SDK's own retry,
// honouring it, then succeeds. A call that can never fit is an
// invalid_request_error, which the SDK does not retry.
func TestMessagesRefusalAndTheSDKRetries(t *testing.T) {
	t.Parallel()
	// 100 tokens/s: the second call is about 340 tokens short, about 3.4 s
	// of refill. At 1000/s it was 340 ms, and a stall that long on the real
	// clock admitted what the test expects refused.
	b := setup(t, rule.Limits{TokensCapacity: 700, TokensRateMicro: 100 * rule.Micro})
	var h heard
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		h.add(r, body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,
			"usage":{"input_tokens":20,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":500}}`)
	}
	if _, err := b.anthropicClient(0).Messages.New(ctx, claudeParams(500, "Hello")); err != nil { // about 520 of 700
		t.Fatal(err)
	}
	_, err := b.anthropicClient(0).Messages.New(ctx, claudeParams(500, "Hello"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || !strings.Contains(apiErr.RawJSON(), `"rate_limit_error"`) {
		t.Fatalf("over the allowance: %v", err)
	}
	hd := apiErr.Response.Header
	if hd.Get("Retry-After") == "" || hd.Get("Anthropic-Ratelimit-Tokens-Remaining") == "" || hd.Get("Anthropic-Ratelimit-Tokens-Limit") != "700" {
		t.Fatalf("429 headers: %v", hd)
	}
	if _, err := time.Parse(time.RFC3339, hd.Get("Anthropic-Ratelimit-Tokens-Reset")); err != nil {
		t.Fatalf("anthropic-ratelimit-tokens-reset: %v", err)
	}
	if _, err := b.anthropicClient(3).Messages.New(ctx, claudeParams(500, "Hello")); err != nil {
		t.Fatalf("the SDK's retry: %v", err)
	}
	if as := b.admissions(t); len(as) != 2 || h.count() != 2 {
		t.Fatalf("%d admissions, %d upstream calls; the refusals must not count", len(as), h.count())
	}
	// Never fits: 800 output tokens against a capacity of 700.
	_, err = b.anthropicClient(3).Messages.New(ctx, claudeParams(800, "Hello"))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.RawJSON(), `"invalid_request_error"`) {
		t.Fatalf("never fits: %v", err)
	}
	if as := b.admissions(t); len(as) != 2 || h.count() != 2 {
		t.Fatalf("%d admissions, %d upstream calls after a call that never fits", len(as), h.count())
	}
	b.verify(t)
}

// TestMessagesStreamBrokenOrClientLeaves: a stream that breaks, or whose
// client goes away, settles with message_start's input and cache usage
// and the text streamed so far, counted as the estimate counts.
func TestMessagesStreamBrokenOrClientLeaves(t *testing.T) {
	t.Parallel()
	chunks := []string{"The gateway ", "admits ", "requests ", "only when ", "the tenant's ", "bucket ", "allows them."}
	scaled := func(n int) int64 {
		c, err := estimator.CountText(estimator.EncodingO200K, strings.Join(chunks[:n], ""))
		if err != nil {
			t.Fatal(err)
		}
		return estimator.ScaleMessagesCount("claude-sonnet-4-5", int64(c))
	}
	t.Run("upstream breaks", func(t *testing.T) {
		t.Parallel()
		b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
		b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
			w.Header().Set("Content-Type", "text/event-stream")
			sse(w, messageStart)
			for _, c := range chunks[:3] {
				sse(w, textDelta(c))
			}
			panic(http.ErrAbortHandler) // the connection drops mid-stream
		}
		stream := b.anthropicClient(0).Messages.NewStreaming(ctx, claudeParams(1024, "Explain."))
		for stream.Next() {
		}
		if stream.Err() == nil {
			t.Fatal("the SDK saw no error")
		}
		b.eventually(t, func(a *account.Admission) bool { return a.State == account.StateSettled })
		a := b.admissions(t)[0]
		if *a.ActualInput != streamInput || *a.ActualOutput != scaled(3) {
			t.Fatalf("settled %d in / %d out; want %d / %d", *a.ActualInput, *a.ActualOutput, streamInput, scaled(3))
		}
		if got := b.balance(t); got != 100_000-*a.ActualCost {
			t.Fatalf("balance %d, want %d", got, 100_000-*a.ActualCost)
		}
		b.verify(t)
	})
	t.Run("upstream sends an error event", func(t *testing.T) {
		t.Parallel()
		b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
		b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
			w.Header().Set("Content-Type", "text/event-stream")
			sse(w, messageStart)
			for _, c := range chunks[:4] {
				sse(w, textDelta(c))
			}
			sse(w, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
		}
		stream := b.anthropicClient(0).Messages.NewStreaming(ctx, claudeParams(1024, "Explain."))
		for stream.Next() {
		}
		if err := stream.Err(); err == nil || !strings.Contains(err.Error(), "overloaded") {
			t.Fatalf("the SDK saw %v, want the relayed overloaded_error", err)
		}
		b.eventually(t, func(a *account.Admission) bool { return a.State == account.StateSettled })
		a := b.admissions(t)[0]
		if *a.ActualInput != streamInput || *a.ActualOutput != scaled(4) {
			t.Fatalf("settled %d in / %d out; want %d / %d", *a.ActualInput, *a.ActualOutput, streamInput, scaled(4))
		}
		b.verify(t)
	})
	t.Run("client leaves", func(t *testing.T) {
		t.Parallel()
		b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
		b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
			w.Header().Set("Content-Type", "text/event-stream")
			sse(w, messageStart)
			for _, c := range chunks {
				select {
				case <-r.Context().Done():
					return
				case <-time.After(60 * time.Millisecond):
				}
				sse(w, textDelta(c))
			}
			sse(w, `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":12}}`, `{"type":"message_stop"}`)
		}
		cctx, cancel := context.WithCancel(ctx)
		stream := b.anthropicClient(0).Messages.NewStreaming(cctx, claudeParams(1024, "Explain."))
		deltas := 0
		for stream.Next() {
			if stream.Current().Type == "content_block_delta" {
				if deltas++; deltas == 2 {
					cancel()
				}
			}
		}
		cancel()
		b.eventually(t, func(a *account.Admission) bool { return a.State == account.StateSettled })
		a := b.admissions(t)[0]
		exact := false
		for n := 2; n < len(chunks); n++ {
			exact = exact || *a.ActualOutput == scaled(n)
		}
		if !exact || *a.ActualInput != streamInput {
			t.Fatalf("settled %d in / %d out: not message_start's input and the count of a prefix of at least two deltas", *a.ActualInput, *a.ActualOutput)
		}
		b.verify(t)
	})
}

// TestMessagesIdempotency: a retry with the same Idempotency-Key is the
// same admission, answered 409 with x-should-retry: false (a second
// upstream call would run and cost again), and the SDK does not retry it;
// the key with another body is refused. One debit, one upstream call.
func TestMessagesIdempotency(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	var h heard
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		h.add(r, body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, claudeAnswer)
	}
	key := aoption.WithHeader("Idempotency-Key", "call-0001")
	if _, err := b.anthropicClient(2).Messages.New(ctx, claudeParams(1024, "Hello"), key); err != nil {
		t.Fatal(err)
	}
	_, err := b.anthropicClient(2).Messages.New(ctx, claudeParams(1024, "Hello"), key)
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict || apiErr.Response.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("the retry: %v", err)
	}
	_, err = b.anthropicClient(2).Messages.New(ctx, claudeParams(1024, "Another question"), key)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict || !strings.Contains(apiErr.RawJSON(), "another request") {
		t.Fatalf("the key with another body: %v", err)
	}
	if as := b.admissions(t); len(as) != 1 || h.count() != 1 || b.balance(t) != 100_000-claudeAnswerInput-claudeAnswerOutput {
		t.Fatalf("%d admissions, %d upstream calls, balance %d", len(as), h.count(), b.balance(t))
	}
	b.verify(t)
}

// TestMessagesUpstreamRefusesBeforeOutput: Anthropic's own 529 is relayed
// as it is (the SDK reads its error) and the reservation released:
// nothing is charged.
func TestMessagesUpstreamRefusesBeforeOutput(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(529)
		fmt.Fprint(w, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
	}
	_, err := b.anthropicClient(0).Messages.New(ctx, claudeParams(1024, "Hello"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 529 || !strings.Contains(apiErr.RawJSON(), "overloaded_error") {
		t.Fatalf("%v", err)
	}
	if as := b.admissions(t); len(as) != 1 || as[0].State != account.StateReleased || b.balance(t) != 100_000 {
		t.Fatalf("admissions %+v, balance %d: a refused call was charged", as, b.balance(t))
	}
	b.verify(t)
}

// TestMessagesCountTokensFromUpstream: with CountTokensUpstream
// (--anthropic-count-tokens upstream) count_tokens is Anthropic's own
// count, asked with tokengate's key and the client's anthropic-version;
// when the upstream fails it is the estimate. A body the estimator refuses
// never reaches the upstream, and nothing is ever debited.
func TestMessagesCountTokensFromUpstream(t *testing.T) {
	t.Parallel()
	b := setupWith(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1}, func(c *proxy.Config) { c.CountTokensUpstream = true })
	var h heard
	var failing atomic.Bool
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		h.add(r, body)
		if r.URL.Path != "/v1/messages/count_tokens" {
			t.Errorf("count_tokens went to %s", r.URL.Path)
		}
		if failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"input_tokens":4242}`)
	}
	params := anthropic.MessageCountTokensParams{Model: claudeModel,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("How many tokens is this?"))}}
	res, err := b.anthropicClient(0).Messages.CountTokens(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if res.InputTokens != 4242 {
		t.Fatalf("count_tokens %d, want the upstream's 4242", res.InputTokens)
	}
	if h.count() != 1 || h.headers[0].Get("X-Api-Key") != "sk-ant-upstream" || h.headers[0].Get("Anthropic-Version") == "" ||
		strings.Contains(fmt.Sprint(h.headers[0]), b.key) {
		t.Fatalf("upstream heard %d calls, headers %v", h.count(), h.headers)
	}

	// The upstream fails: the estimate answers.
	failing.Store(true)
	res, err = b.anthropicClient(0).Messages.CountTokens(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	req, err := estimator.ParseCountTokens([]byte(`{"model":"` + claudeModel + `","messages":[{"role":"user","content":[{"type":"text","text":"How many tokens is this?"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want, err := b.est.Estimate(req)
	if err != nil {
		t.Fatal(err)
	}
	if res.InputTokens != want.InputTokens || h.count() != 2 {
		t.Fatalf("with the upstream down: %d, want the estimate's %d (%d upstream calls)", res.InputTokens, want.InputTokens, h.count())
	}

	// A bad body is refused here.
	_, err = b.anthropicClient(0).Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: claudeModel})
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || h.count() != 2 {
		t.Fatalf("no messages: %v (%d upstream calls)", err, h.count())
	}
	if len(b.admissions(t)) != 0 || b.balance(t) != 100_000 {
		t.Fatalf("count_tokens admitted %d, balance %d", len(b.admissions(t)), b.balance(t))
	}
	b.verify(t)
}
