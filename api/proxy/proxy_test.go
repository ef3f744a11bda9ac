package proxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokengate/tokengate/api"
	"github.com/tokengate/tokengate/api/proxy"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/await"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var ctx = context.Background()

// upstream emulates OpenAI's wire format. Each call is answered by the
// test's behaviour; what it received is kept.
type upstream struct {
	mu     sync.Mutex
	bodies []map[string]any
	auth   []string
	behave func(w http.ResponseWriter, r *http.Request, body map[string]any)
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	_ = json.Unmarshal(raw, &body)
	u.mu.Lock()
	u.bodies = append(u.bodies, body)
	u.auth = append(u.auth, r.Header.Get("Authorization"))
	u.mu.Unlock()
	u.behave(w, r, body)
}

func (u *upstream) last() (map[string]any, string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.bodies[len(u.bodies)-1], u.auth[len(u.auth)-1]
}

type bundle struct {
	pool   *pgxpool.Pool
	store  *account.Store
	up     *upstream
	client openai.Client
	key    string
	est    *estimator.Estimator
	base   string
	reg    *prometheus.Registry

	admitter   *admission.Admitter
	rejections *account.Rejections
	spy        *settleSpy
}

// settleSpy is the store the admission layer decides through: the real
// one, noting each settle it is given, so a test sees what the face parsed
// (the reasoning tokens, which no balance shows).
type settleSpy struct {
	*account.Store
	mu      sync.Mutex
	settles []account.SettleParams
}

func (s *settleSpy) DecideBatch(ctx context.Context, items []account.Item) ([]account.OpResult, error) {
	s.mu.Lock()
	for _, it := range items {
		if it.Op.Settle != nil {
			s.settles = append(s.settles, *it.Op.Settle)
		}
	}
	s.mu.Unlock()
	return s.Store.DecideBatch(ctx, items)
}

// settled returns the settles decided so far, in order.
func (s *settleSpy) settled() []account.SettleParams {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]account.SettleParams(nil), s.settles...)
}

// setup runs the proxy in front of an emulated upstream, with a tenant
// whose key the OpenAI SDK uses as its API key.
func setup(t testing.TB, limits rule.Limits) *bundle {
	t.Helper()
	return setupWith(t, limits, nil)
}

// setupWith is setup with the proxy's configuration changed by configure.
func setupWith(t testing.TB, limits rule.Limits, configure func(*proxy.Config)) *bundle {
	t.Helper()
	return setupTraced(t, limits, configure, nil)
}

// setupTraced is setupWith with the replica's tracing.
func setupTraced(t testing.TB, limits rule.Limits, configure func(*proxy.Config), tracing *replica.Tracing) *bundle {
	t.Helper()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: limits}); err != nil {
		t.Fatal(err)
	}
	_, key, err := credential.KeyCreate(ctx, pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	est := estimator.New(nil)
	table, err := estimator.DefaultTable().With([]estimator.Model{{Name: "gpt-4o", Encoding: estimator.EncodingO200K,
		InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne, CachedInputWeightMicro: estimator.WeightOne / 2,
		DefaultOutputTokens: 16384, ContextWindow: 128000, PartTokens: 765}})
	if err != nil {
		t.Fatal(err)
	}
	est.SetTable(table)
	up := &upstream{}
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	upURL, _ := url.Parse(upSrv.URL)
	reg := prometheus.NewRegistry()
	rejections := account.NewRejections(pool)
	spy := &settleSpy{Store: store}
	rep, err := replica.New(replica.Config{DB: pool, Store: store, Admissions: spy, Estimator: est, Registry: reg, Rejections: rejections,
		Tracing: tracing})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rep.Close)
	a := rep.Admitter
	cfg := proxy.Config{Upstream: upURL, UpstreamKey: "sk-upstream", AnthropicUpstream: upURL, AnthropicKey: "sk-ant-upstream"}
	if configure != nil {
		configure(&cfg)
	}
	p := proxy.New(rep, cfg)
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
	return &bundle{pool: pool, store: store, up: up, client: client, key: key, est: est, base: srv.URL, reg: reg, admitter: a, rejections: rejections, spy: spy}
}

func chatParams(max int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: "gpt-4o", MaxTokens: openai.Int(max),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello to the platform team.")}}
}

// post sends a raw chat completion call with the tenant's key and the
// headers given as name, value pairs; it returns the status, the headers
// and the body.
func (b *bundle) post(t *testing.T, body string, headers ...string) (int, http.Header, string) {
	t.Helper()
	return postChat(t, b.base, b.key, strings.NewReader(body), headers...)
}

// postChat sends a raw chat completion call to the proxy at base with key.
func postChat(t *testing.T, base, key string, body io.Reader, headers ...string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", body)
	req.Header.Set("Authorization", "Bearer "+key)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(raw)
}

// admissions returns the tenant's admissions, oldest first.
func (b *bundle) admissions(t *testing.T) []*account.Admission {
	t.Helper()
	as, err := b.store.AdmissionRecent(ctx, "acme", 100)
	if err != nil {
		t.Fatal(err)
	}
	for i, j := 0, len(as)-1; i < j; i, j = i+1, j-1 {
		as[i], as[j] = as[j], as[i]
	}
	return as
}

func (b *bundle) verify(t *testing.T) {
	t.Helper()
	if _, err := ledger.Verify(ctx, b.pool, "acme"); err != nil {
		t.Fatal(err)
	}
	for _, a := range b.admissions(t) {
		if a.State == account.StateReserved {
			t.Fatalf("admission %s left reserved", a.ID)
		}
	}
}

func writeSSE(w http.ResponseWriter, events ...string) {
	for _, e := range events {
		fmt.Fprintf(w, "data: %s\n\n", e)
		w.(http.Flusher).Flush()
	}
}

func chatChunk(text string) string {
	return fmt.Sprintf(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}]}`, text)
}

const usageChunk = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":9,"total_tokens":29,"completion_tokens_details":{"reasoning_tokens":4}}}`

// TestChatSettlesFromUsage: the SDK's call is admitted, forwarded with the
// upstream's key (never the tenant's), and settled from the usage: cached
// input at the model's cached weight, reasoning tokens as output.
func TestChatSettlesFromUsage(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: rule.Micro})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Hello, platform team!"},"finish_reason":"stop"}],
			"usage":{"prompt_tokens":40,"completion_tokens":25,"total_tokens":65,"prompt_tokens_details":{"cached_tokens":30},"completion_tokens_details":{"reasoning_tokens":10}}}`)
	}
	resp, err := b.client.Chat.Completions.New(ctx, chatParams(100))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content != "Hello, platform team!" || resp.Usage.TotalTokens != 65 {
		t.Fatalf("answer: %+v", resp)
	}
	if _, auth := b.up.last(); auth != "Bearer sk-upstream" {
		t.Fatalf("the upstream got %q", auth)
	}
	as := b.admissions(t)
	// 10 uncached + 30 cached at half weight = 25 input; 25 output.
	if len(as) != 1 || as[0].State != account.StateSettled || *as[0].ActualInput != 25 || *as[0].ActualOutput != 25 || *as[0].ActualCost != 50 {
		t.Fatalf("admission: %+v", as)
	}
	// The settle carries the reasoning part of the output, for money.
	if s := b.spy.settled(); len(s) != 1 || s[0].ReasoningTokens != 10 || s[0].OutputTokens != 25 || s[0].CachedInputTokens != 30 {
		t.Fatalf("settles: %+v", s)
	}
	b.verify(t)
}

// TestStreamingChat: a stream without include_usage is asked for it
// upstream, settled from it, and the client never sees that chunk; a
// client that asked for it gets it.
func TestStreamingChat(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: rule.Micro})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "text/event-stream")
		events := []string{chatChunk("Hello"), chatChunk(", platform"), chatChunk(" team!")}
		if so, _ := body["stream_options"].(map[string]any); so["include_usage"] == true {
			events = append(events, usageChunk)
		}
		writeSSE(w, append(events, "[DONE]")...)
	}
	for _, asked := range []bool{false, true} {
		p := chatParams(100)
		if asked {
			p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		}
		stream := b.client.Chat.Completions.NewStreaming(ctx, p)
		var text strings.Builder
		sawUsage := false
		for stream.Next() {
			ch := stream.Current()
			for _, c := range ch.Choices {
				text.WriteString(c.Delta.Content)
			}
			if ch.Usage.TotalTokens > 0 {
				sawUsage = true
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if text.String() != "Hello, platform team!" || sawUsage != asked {
			t.Fatalf("asked for usage %v: text %q, usage chunk seen %v", asked, text.String(), sawUsage)
		}
		if body, _ := b.up.last(); body["stream_options"].(map[string]any)["include_usage"] != true {
			t.Fatalf("the upstream was not asked for usage: %v", body)
		}
	}
	for _, a := range b.admissions(t) {
		if a.State != account.StateSettled || *a.ActualInput != 20 || *a.ActualOutput != 9 {
			t.Fatalf("admission: %+v", a)
		}
	}
	if s := b.spy.settled(); len(s) != 2 || s[0].ReasoningTokens != 4 || s[1].ReasoningTokens != 4 {
		t.Fatalf("settles: %+v", s)
	}
	b.verify(t)
}

// TestReasoningTokensWithinOutput: the upstream's reasoning count is part
// of its output; one that is negative, larger than the output, or beyond
// an output clamped to the request's bound is held within the output the
// settle charges, so the settle is never refused for it.
func TestReasoningTokensWithinOutput(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: rule.Micro})
	var answer atomic.Value
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],
			"usage":`+answer.Load().(string)+`}`)
	}
	for _, tc := range []struct {
		usage               string
		output, reasoning   int64
		outputBelowReported bool
	}{
		{`{"prompt_tokens":10,"completion_tokens":5,"completion_tokens_details":{"reasoning_tokens":9}}`, 5, 5, false},
		{`{"prompt_tokens":10,"completion_tokens":5,"completion_tokens_details":{"reasoning_tokens":-3}}`, 5, 0, false},
		{`{"prompt_tokens":10,"completion_tokens":5,"completion_tokens_details":{}}`, 5, 0, false},
		// 500 output tokens for a call that could write 100: clamped,
		// and its 450 reasoning tokens with it.
		{`{"prompt_tokens":10,"completion_tokens":500,"completion_tokens_details":{"reasoning_tokens":450}}`, 0, 0, true},
	} {
		answer.Store(tc.usage)
		if _, err := b.client.Chat.Completions.New(ctx, chatParams(100)); err != nil {
			t.Fatal(err)
		}
		s := b.spy.settled()
		got := s[len(s)-1]
		switch {
		case tc.outputBelowReported:
			if got.OutputTokens >= 500 || got.ReasoningTokens != got.OutputTokens {
				t.Errorf("%s: settled %+v, want the output clamped and reasoning with it", tc.usage, got)
			}
		case got.OutputTokens != tc.output || got.ReasoningTokens != tc.reasoning:
			t.Errorf("%s: settled output %d, reasoning %d; want %d, %d", tc.usage, got.OutputTokens, got.ReasoningTokens, tc.output, tc.reasoning)
		}
	}
	for _, a := range b.admissions(t) {
		if a.State != account.StateSettled {
			t.Fatalf("admission not settled: %+v", a)
		}
	}
	b.verify(t)
}

// streamedTokens is the count of the first n chunks' text.
func streamedTokens(t *testing.T, chunks []string, n int) int64 {
	t.Helper()
	c, err := estimator.CountText(estimator.EncodingO200K, strings.Join(chunks[:n], ""))
	if err != nil {
		t.Fatal(err)
	}
	return int64(c)
}

// TestStreamBrokenOrAbandonedSettlesWhatWasStreamed: the upstream breaks
// mid-stream (a 500 after three chunks), or the client goes away: the
// request is settled with its input and exactly the tokens streamed so far.
func TestStreamBrokenOrAbandonedSettlesWhatWasStreamed(t *testing.T) {
	t.Parallel()
	chunks := []string{"The gateway ", "admits ", "requests ", "only when ", "the tenant's ", "bucket ", "allows them."}
	t.Run("upstream breaks", func(t *testing.T) {
		t.Parallel()
		b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: rule.Micro})
		b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, c := range chunks[:3] {
				writeSSE(w, chatChunk(c))
			}
			panic(http.ErrAbortHandler) // the connection drops mid-stream
		}
		stream := b.client.Chat.Completions.NewStreaming(ctx, chatParams(200))
		for stream.Next() {
		}
		_ = stream.Err()
		b.eventually(t, func(a *account.Admission) bool { return a.State == account.StateSettled })
		a := b.admissions(t)[0]
		if *a.ActualOutput != streamedTokens(t, chunks, 3) || *a.ActualInput != a.Estimate.InputTokens {
			t.Fatalf("settled %d in / %d out; want %d / %d", *a.ActualInput, *a.ActualOutput, a.Estimate.InputTokens, streamedTokens(t, chunks, 3))
		}
		b.verify(t)
	})
	t.Run("upstream sends an error event", func(t *testing.T) {
		// OpenAI's own mid-stream failure: a 200 stream that carries an
		// error event and ends without usage.
		t.Parallel()
		b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: rule.Micro})
		b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, c := range chunks[:4] {
				writeSSE(w, chatChunk(c))
			}
			writeSSE(w, `{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}`)
		}
		stream := b.client.Chat.Completions.NewStreaming(ctx, chatParams(200))
		for stream.Next() {
		}
		if stream.Err() == nil {
			t.Fatal("the SDK saw no error")
		}
		b.eventually(t, func(a *account.Admission) bool { return a.State == account.StateSettled })
		a := b.admissions(t)[0]
		if *a.ActualOutput != streamedTokens(t, chunks, 4) || *a.ActualInput != a.Estimate.InputTokens {
			t.Fatalf("settled %d in / %d out; want %d / %d", *a.ActualInput, *a.ActualOutput, a.Estimate.InputTokens, streamedTokens(t, chunks, 4))
		}
		b.verify(t)
	})
	t.Run("client leaves", func(t *testing.T) {
		t.Parallel()
		b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: rule.Micro})
		b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, c := range chunks {
				select {
				case <-r.Context().Done():
					return
				case <-time.After(60 * time.Millisecond):
				}
				writeSSE(w, chatChunk(c))
			}
			writeSSE(w, usageChunk, "[DONE]")
		}
		cctx, cancel := context.WithCancel(ctx)
		stream := b.client.Chat.Completions.NewStreaming(cctx, chatParams(200))
		for n := 0; stream.Next(); n++ {
			if n == 1 {
				cancel() // after two chunks
			}
		}
		cancel()
		b.eventually(t, func(a *account.Admission) bool { return a.State == account.StateSettled })
		a := b.admissions(t)[0]
		exact := false
		for n := 2; n < len(chunks); n++ {
			exact = exact || *a.ActualOutput == streamedTokens(t, chunks, n)
		}
		if !exact || *a.ActualInput != a.Estimate.InputTokens {
			t.Fatalf("settled %d out: not the count of a prefix of at least two chunks", *a.ActualOutput)
		}
		b.verify(t)
	})
}

// eventually waits for the tenant's one admission to satisfy ok.
func (b *bundle) eventually(t *testing.T, ok func(*account.Admission) bool) {
	t.Helper()
	await.Until(t, 5*time.Second, "the admission's state", func() bool {
		as := b.admissions(t)
		return len(as) == 1 && ok(as[0])
	}, func() string { return fmt.Sprintf("%+v", b.admissions(t)) })
}

// TestUpstreamFailsBeforeFirstByte: a 500 before any output is relayed to
// the SDK as OpenAI's error, and the reservation is released: nothing is
// charged.
func TestUpstreamFailsBeforeFirstByte(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"error":{"message":"overloaded","type":"server_error","param":null,"code":null}}`)
	}
	_, err := b.client.Chat.Completions.New(ctx, chatParams(100))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusInternalServerError {
		t.Fatalf("%v", err)
	}
	as := b.admissions(t)
	if len(as) != 1 || as[0].State != account.StateReleased {
		t.Fatalf("admission: %+v", as)
	}
	snap, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil || snap.Tokens() != 100_000 {
		t.Fatalf("balance %d (%v): a failed call was charged", snap.Tokens(), err)
	}
	b.verify(t)
}

// TestRefusalIsOpenAIs429AndTheSDKRetries: over the allowance the proxy
// answers OpenAI's 429 with retry-after-ms and the x-ratelimit headers and
// charges nothing; the SDK's own retry, honouring it, then succeeds.
func TestRefusalIsOpenAIs429AndTheSDKRetries(t *testing.T) {
	t.Parallel()
	// 20 tokens/s: the second request is about 78 tokens short, about 4 s of
	// refill. At 200/s it was 390 ms, and a stall that long on the real
	// clock admitted what the test expects refused.
	b := setup(t, rule.Limits{TokensCapacity: 150, TokensRateMicro: 20 * rule.Micro})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":14,"completion_tokens":100,"total_tokens":114}}`)
	}
	if _, err := b.client.Chat.Completions.New(ctx, chatParams(100)); err != nil { // about 114 of 150
		t.Fatal(err)
	}
	status, header, raw := b.post(t, `{"model":"gpt-4o","max_tokens":100,"messages":[{"role":"user","content":"Say hello to the platform team."}]}`)
	var body struct {
		Error struct{ Type, Code, Message string } `json:"error"`
	}
	_ = json.Unmarshal([]byte(raw), &body)
	if status != http.StatusTooManyRequests || body.Error.Code != "rate_limit_exceeded" || header.Get("Retry-After-Ms") == "" ||
		header.Get("Retry-After") == "" || header.Get("X-Ratelimit-Remaining-Tokens") == "" {
		t.Fatalf("%d %s %v", status, raw, header)
	}
	retrying := openai.NewClient(option.WithBaseURL(b.base+"/v1/"), option.WithAPIKey(b.key), option.WithMaxRetries(3))
	if _, err := retrying.Chat.Completions.New(ctx, chatParams(100)); err != nil {
		t.Fatalf("the SDK's retry: %v", err)
	}
	if as := b.admissions(t); len(as) != 2 {
		t.Fatalf("%d admissions; the refusal must not count", len(as))
	}
	b.verify(t)
	// The refusal is counted as the API counts its own (issue 22): in
	// tokengate_admissions_total, by face, and in the dashboard's tally,
	// which the throttled alerts read.
	// The SDK's retry may be refused again before its wait is over: every
	// refusal the proxy answered is one rejection.
	refused := counterValue(t, b.reg, "refused")
	for _, c := range []struct {
		outcome, limit string
		want           float64
	}{{"admitted", "", 2}, {"rejected", "tokens", refused}} {
		if got := testutil.ToFloat64(b.admitter.Admissions(admission.FaceProxy, c.outcome, c.limit)); got != c.want || got == 0 {
			t.Errorf("tokengate_admissions_total{face=proxy,outcome=%s}: %v, want %v", c.outcome, got, c.want)
		}
	}
	if err := b.rejections.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var tallied int64
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(sum(count), 0) FROM rejection_counts WHERE tenant_id = 'acme' AND limit_name = 'tokens' AND NOT shadow`).Scan(&tallied); err != nil {
		t.Fatal(err)
	}
	if float64(tallied) != refused {
		t.Fatalf("the dashboard's tally holds %d refusals, want the proxy's %v", tallied, refused)
	}
}

// TestResponsesAndCompletions: the Responses API (plain and streamed, its
// usage in response.completed) and legacy completions settle from their
// usage like chat does.
func TestResponsesAndCompletions(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: rule.Micro})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		switch {
		case r.URL.Path == "/v1/completions":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"id":"cmpl","object":"text_completion","created":1,"model":"gpt-3.5-turbo-instruct","choices":[{"index":0,"text":"hi","finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`)
		case body["stream"] == true:
			w.Header().Set("Content-Type", "text/event-stream")
			writeSSE(w,
				`{"type":"response.output_text.delta","sequence_number":1,"item_id":"m1","output_index":0,"content_index":0,"delta":"Hello"}`,
				`{"type":"response.completed","sequence_number":2,"response":{"id":"r1","object":"response","created_at":1,"status":"completed","model":"gpt-4o","output":[],"usage":{"input_tokens":12,"output_tokens":7,"total_tokens":19,"input_tokens_details":{"cached_tokens":0},"output_tokens_details":{"reasoning_tokens":3}}}}`)
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"id":"r1","object":"response","created_at":1,"status":"completed","model":"gpt-4o","output":[{"type":"message","id":"m1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello","annotations":[]}]}],
				"usage":{"input_tokens":12,"output_tokens":7,"total_tokens":19,"input_tokens_details":{"cached_tokens":4},"output_tokens_details":{"reasoning_tokens":3}}}`)
		}
	}
	params := responses.ResponseNewParams{Model: "gpt-4o", MaxOutputTokens: openai.Int(50),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Say hello.")}}
	if _, err := b.client.Responses.New(ctx, params); err != nil {
		t.Fatal(err)
	}
	stream := b.client.Responses.NewStreaming(ctx, params)
	for stream.Next() {
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.Completions.New(ctx, openai.CompletionNewParams{Model: "gpt-3.5-turbo-instruct", MaxTokens: openai.Int(10),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Say hi")}}); err != nil {
		t.Fatal(err)
	}
	as := b.admissions(t)
	want := [][2]int64{{8 + 2, 7}, {12, 7}, {3, 2}} // 4 cached of 12 at half weight; none cached; completions
	if len(as) != 3 {
		t.Fatalf("%d admissions", len(as))
	}
	for i, a := range as {
		if a.State != account.StateSettled || *a.ActualInput != want[i][0] || *a.ActualOutput != want[i][1] {
			t.Fatalf("admission %d: %+v; want %v", i, a, want[i])
		}
	}
	// output_tokens_details.reasoning_tokens, whole and streamed; legacy
	// completions report none.
	settles := b.spy.settled()
	if len(settles) != 3 || settles[0].ReasoningTokens != 3 || settles[1].ReasoningTokens != 3 || settles[2].ReasoningTokens != 0 {
		t.Fatalf("settles: %+v", settles)
	}
	b.verify(t)
}

// TestBadCallsAreOpenAIErrorsAndChargeNothing: an unknown key is a 401,
// bad input a 400 naming the field, a retry of an admitted call under the
// same Idempotency-Key a 409 that never reaches the upstream twice; none
// of them debits or writes the ledger beyond the one admitted call.
func TestBadCallsAreOpenAIErrorsAndChargeNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1}) // refills one token in 11 days: the balance is exact
	var calls atomic.Int32
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":14,"completion_tokens":2,"total_tokens":16}}`)
	}
	wrong := openai.NewClient(option.WithBaseURL(b.base+"/v1/"), option.WithAPIKey("tg_nosuchkey_0000000000"), option.WithMaxRetries(0))
	_, err := wrong.Chat.Completions.New(ctx, chatParams(100))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized || apiErr.Code != "invalid_api_key" {
		t.Fatalf("unknown key: %v", err)
	}
	post := func(body, idem string) (int, string) {
		var headers []string
		if idem != "" {
			headers = []string{"Idempotency-Key", idem}
		}
		status, _, raw := b.post(t, body, headers...)
		return status, raw
	}
	for _, bad := range []struct{ body, param string }{
		{`{"model":"gpt-4o","messages":"hello"}`, `"param":"messages"`},
		{`{"model":"gpt-4o","max_tokens":-1,"messages":[{"role":"user","content":"hi"}]}`, `"param":"max_tokens"`},
		{`{"model":"gpt-4o","stream":true,"stream_options":7,"messages":[{"role":"user","content":"hi"}]}`, `"param":"stream_options"`},
		{`not json`, `"invalid_request_error"`},
	} {
		if status, raw := post(bad.body, ""); status != http.StatusBadRequest || !strings.Contains(raw, bad.param) {
			t.Fatalf("%s: %d %s, want 400 with %s", bad.body, status, raw, bad.param)
		}
	}
	good := `{"model":"gpt-4o","max_tokens":100,"messages":[{"role":"user","content":"Say hello to the platform team."}]}`
	if status, raw := post(good, "call-1"); status != http.StatusOK {
		t.Fatalf("first call: %d %s", status, raw)
	}
	if status, raw := post(good, "call-1"); status != http.StatusConflict || !strings.Contains(raw, "Idempotency-Key") {
		t.Fatalf("retry under the same key: %d %s, want 409", status, raw)
	}
	if status, raw := post(strings.Replace(good, "hello", "goodbye", 1), "call-1"); status != http.StatusConflict {
		t.Fatalf("another request under the same key: %d %s, want 409", status, raw)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the upstream was called %d times, want 1", n)
	}
	as := b.admissions(t)
	if len(as) != 1 || as[0].State != account.StateSettled || *as[0].ActualCost != 16 {
		t.Fatalf("admissions: %+v", as)
	}
	snap, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if got := 100_000 - snap.Tokens(); got != 16 {
		t.Fatalf("the balance moved by %d, want the one call's 16", got)
	}
	b.verify(t)
}

// TestBehindALoadBalancerGuessesAreLimitedPerClient: with the API's client
// address (X-Forwarded-For from a trusted proxy), a client guessing a key's
// secret through the proxy is throttled, and another client behind the
// same load balancer is not.
func TestBehindALoadBalancerGuessesAreLimitedPerClient(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	_, lb, _ := net.ParseCIDR("127.0.0.0/8") // the test's connections
	rep, err := replica.New(replica.Config{DB: pool, Store: store, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)),
		AuthFailuresPerSecond: 0.001, AuthFailureBurst: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rep.Close)
	srv, err := api.New(rep, &api.Config{TrustedProxies: []*net.IPNet{lb}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro}}); err != nil {
		t.Fatal(err)
	}
	_, key, err := credential.KeyCreate(ctx, pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	wrong := key[:strings.LastIndex(key, "_")+1] + strings.Repeat("a", len(key)-strings.LastIndex(key, "_")-1)
	upURL, _ := url.Parse("http://127.0.0.1:1")
	px := httptest.NewServer(proxy.New(rep, proxy.Config{Upstream: upURL, ClientAddr: srv.ClientAddr}))
	defer px.Close()
	guess := func(from string) int {
		req, _ := http.NewRequest(http.MethodPost, px.URL+"/v1/chat/completions", strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer "+wrong)
		req.Header.Set("X-Forwarded-For", from)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 3 {
		if code := guess("203.0.113.1"); code != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d", i, code)
		}
	}
	if code := guess("203.0.113.1"); code != http.StatusTooManyRequests {
		t.Fatalf("the guesser's fourth guess: %d, want 429", code)
	}
	if code := guess("198.51.100.7"); code != http.StatusUnauthorized {
		t.Fatalf("another client behind the load balancer: %d, want 401 (not throttled)", code)
	}
}

// TestUpstreamAbsurdUsageIsClamped: the upstream reports usage no request
// could produce (a billion tokens each way, issue 21). The request ran, so
// the call is settled, but at the bound: the output reserved, the rest of
// the model's window as input; and counted as usage_clamped.
func TestUpstreamAbsurdUsageIsClamped(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 1_000_000, TokensRateMicro: rule.Micro})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],
			"usage":{"prompt_tokens":1000000000,"completion_tokens":1000000000,"total_tokens":2000000000}}`)
	}
	if _, err := b.client.Chat.Completions.New(ctx, chatParams(100)); err != nil {
		t.Fatal(err)
	}
	as := b.admissions(t)
	if len(as) != 1 || as[0].State != account.StateSettled || *as[0].ActualOutput != 100 || *as[0].ActualInput != 128_000-100 || *as[0].ActualCost != 128_000 {
		t.Fatalf("admission: %+v", as)
	}
	if got := counterValue(t, b.reg, "usage_clamped"); got != 1 {
		t.Fatalf("usage_clamped %v, want 1", got)
	}
	b.verify(t)
}

func counterValue(t *testing.T, reg *prometheus.Registry, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tokengate_proxy_calls_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no tokengate_proxy_calls_total{outcome=%q}", outcome)
	return 0
}

// TestTooLargeIs422LikeTheAPI: a request that can never fit the tenant's
// limits is the same refusal through every face (issue 22): 422
// request_too_large, as the HTTP API answers it, with nothing reserved and
// no upstream call.
func TestTooLargeIs422LikeTheAPI(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 150, TokensRateMicro: rule.Micro})
	var calls int
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) { calls++ }
	status, _, raw := b.post(t, `{"model":"gpt-4o","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}`)
	if status != http.StatusUnprocessableEntity || !strings.Contains(raw, `"code":"request_too_large"`) {
		t.Fatalf("%d %s, want 422 request_too_large", status, raw)
	}
	if calls != 0 || len(b.admissions(t)) != 0 {
		t.Fatalf("%d upstream calls, %d admissions after a refusal", calls, len(b.admissions(t)))
	}
	if got := testutil.ToFloat64(b.admitter.Admissions(admission.FaceProxy, "too_large", "tokens")); got != 1 {
		t.Fatalf("tokengate_admissions_total{face=proxy,outcome=too_large}: %v, want 1", got)
	}
}
