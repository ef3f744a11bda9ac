package proxy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"google.golang.org/genai"

	"github.com/tokengate/tokengate/api/proxy"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

// geminiModel is a seeded Gemini family: weights 1, cached content 0.1.
const geminiModel = "gemini-2.5-flash"

// setupGemini is setup with the Gemini wire on, in front of the same
// emulated upstream, with tokengate's own Gemini key.
func setupGemini(t testing.TB, limits rule.Limits) *bundle {
	t.Helper()
	return setupWith(t, limits, func(cfg *proxy.Config) {
		cfg.GeminiUpstream, cfg.GeminiKey = cfg.Upstream, "goog-upstream"
	})
}

// geminiClient is Google's genai SDK pointed at the proxy with the
// tenant's key: AI Studio's backend (the key as x-goog-api-key), or
// Vertex AI's with a project and location (the key as a bearer token, as
// its credentials' token goes). attempts > 1 turns the SDK's own retry
// on.
func (b *bundle) geminiClient(t *testing.T, vertex bool, attempts int32) *genai.Client {
	t.Helper()
	opts := genai.HTTPOptions{BaseURL: b.base + "/"}
	if attempts > 1 {
		initial, jitter := 1.0, 0.0
		opts.RetryOptions = &genai.HTTPRetryOptions{Attempts: &attempts, InitialDelay: &initial, Jitter: &jitter}
	}
	cfg := &genai.ClientConfig{APIKey: b.key, Backend: genai.BackendGeminiAPI, HTTPOptions: opts}
	if vertex {
		opts.Headers = http.Header{"Authorization": {"Bearer " + b.key}}
		cfg = &genai.ClientConfig{Backend: genai.BackendVertexAI, Project: "proj", Location: "us-central1", HTTPOptions: opts, HTTPClient: &http.Client{}}
	}
	c, err := genai.NewClient(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// geminiHeard is what the emulated Gemini upstream received.
type geminiHeard struct {
	mu      sync.Mutex
	headers []http.Header
	urls    []*url.URL
}

func (h *geminiHeard) add(r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.headers = append(h.headers, r.Header.Clone())
	h.urls = append(h.urls, r.URL)
}

func (h *geminiHeard) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.urls)
}

// geminiAnswer is a GenerateContentResponse with text and usage.
func geminiAnswer(text, finish, usage string) string {
	reason := ""
	if finish != "" {
		reason = `,"finishReason":"` + finish + `"`
	}
	u := ""
	if usage != "" {
		u = `,"usageMetadata":` + usage
	}
	return fmt.Sprintf(`{"candidates":[{"index":0,"content":{"role":"model","parts":[{"text":%q}]}%s}]%s,"modelVersion":"gemini-2.5-flash"}`, text, reason, u)
}

// Thinking, cached content and a tool's prompt: 1000 prompt tokens of
// which 600 cached, 50 of a grounding search's results read as input, 40
// of answer and 100 of thoughts. AI Studio reports the thoughts beside the
// candidates; some Vertex AI answers count them inside
// candidatesTokenCount. Either way the total says the output is 140 (the
// thoughts once), and the input 450 uncached + 600 x 0.1 = 510.
const (
	thinkingUsageStudio = `{"promptTokenCount":1000,"cachedContentTokenCount":600,"candidatesTokenCount":40,"thoughtsTokenCount":100,"toolUsePromptTokenCount":50,"totalTokenCount":1190}`
	thinkingUsageVertex = `{"promptTokenCount":1000,"cachedContentTokenCount":600,"candidatesTokenCount":140,"thoughtsTokenCount":100,"toolUsePromptTokenCount":50,"totalTokenCount":1190}`
	thinkingInput       = 510
	thinkingOutput      = 140
)

// TestGeminiSettlesThinkingCacheAndToolsExactly: the SDK's calls, on AI
// Studio's path and Vertex AI's, and a raw REST call with ?key=, are
// admitted, forwarded with tokengate's x-goog-api-key (the tenant's key
// nowhere: neither header nor query), and settled from usageMetadata:
// thoughts as output exactly once, cached content at 0.1, the tool-use
// prompt as input; to the exact token in the admission, the settle, the
// ledger and the balance.
func TestGeminiSettlesThinkingCacheAndToolsExactly(t *testing.T) {
	t.Parallel()
	b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	var h geminiHeard
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		h.add(r)
		usage := thinkingUsageStudio
		if strings.Contains(r.URL.Path, "/projects/") {
			usage = thinkingUsageVertex
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, geminiAnswer("Hello, platform team!", "STOP", usage))
	}
	budget := int32(1024)
	config := &genai.GenerateContentConfig{MaxOutputTokens: 200, CachedContent: "cachedContents/abc",
		SystemInstruction: genai.NewContentFromText("You are terse.", genai.RoleUser),
		ThinkingConfig:    &genai.ThinkingConfig{ThinkingBudget: &budget, IncludeThoughts: true},
		Tools: []*genai.Tool{{GoogleSearch: &genai.GoogleSearch{}}, {FunctionDeclarations: []*genai.FunctionDeclaration{{Name: "get_weather",
			Description: "Weather by city", Parameters: &genai.Schema{Type: genai.TypeObject, Properties: map[string]*genai.Schema{"city": {Type: genai.TypeString}}}}}}}}
	for _, vertex := range []bool{false, true} {
		resp, err := b.geminiClient(t, vertex, 0).Models.GenerateContent(ctx, geminiModel, genai.Text("Say hello to the platform team."), config)
		if err != nil {
			t.Fatalf("vertex %v: %v", vertex, err)
		}
		if resp.Text() != "Hello, platform team!" || resp.UsageMetadata.ThoughtsTokenCount != 100 {
			t.Fatalf("vertex %v: answer %+v", vertex, resp)
		}
	}
	status, _, raw := geminiPost(t, b.base+"/v1beta/models/"+geminiModel+":generateContent?key="+url.QueryEscape(b.key),
		`{"contents":[{"role":"user","parts":[{"text":"Say hello."}]}],"generationConfig":{"maxOutputTokens":200,"thinkingConfig":{"thinkingBudget":1024}}}`)
	if status != http.StatusOK {
		t.Fatalf("?key= call: %d %s", status, raw)
	}
	wantPaths := []string{"/v1/models/" + geminiModel + ":generateContent", // the SDK's default version
		"/v1beta1/projects/proj/locations/us-central1/publishers/google/models/" + geminiModel + ":generateContent",
		"/v1beta/models/" + geminiModel + ":generateContent"}
	if h.count() != 3 {
		t.Fatalf("%d upstream calls", h.count())
	}
	for i, hd := range h.headers {
		if hd.Get("X-Goog-Api-Key") != "goog-upstream" || hd.Get("Authorization") != "" || h.urls[i].Path != wantPaths[i] || h.urls[i].Query().Has("key") {
			t.Fatalf("call %d: the upstream got %s with x-goog-api-key %q, authorization %q", i, h.urls[i], hd.Get("X-Goog-Api-Key"), hd.Get("Authorization"))
		}
		for name, vs := range hd {
			for _, v := range vs {
				if strings.Contains(v, b.key) {
					t.Fatalf("call %d: the tenant's key reached the upstream in %s", i, name)
				}
			}
		}
	}
	as := b.admissions(t)
	if len(as) != 3 {
		t.Fatalf("%d admissions", len(as))
	}
	var spent int64
	for i, a := range as {
		if a.State != account.StateSettled || *a.ActualInput != thinkingInput || *a.ActualOutput != thinkingOutput ||
			*a.ActualCost != thinkingInput+thinkingOutput || !a.Estimate.Approximate {
			t.Fatalf("admission %d: %+v (estimate %+v)", i, a, a.Estimate)
		}
		if i < 2 && a.Estimate.OutputTokens != 200+1024 {
			t.Fatalf("admission %d reserved %d output; want maxOutputTokens 200 + the thinking budget 1024", i, a.Estimate.OutputTokens)
		}
		spent += *a.ActualCost
	}
	for i, s := range b.spy.settled() {
		if s.InputTokens != 1050 || s.CachedInputTokens != 600 || s.OutputTokens != thinkingOutput || s.ReasoningTokens != 100 {
			t.Fatalf("settle %d: %+v; want 1050 in of which 600 cached, 140 out of which 100 thoughts", i, s)
		}
	}
	if got := b.balance(t); got != 100_000-spent {
		t.Fatalf("balance %d, want %d", got, 100_000-spent)
	}
	b.verify(t)
}

// geminiPost sends a raw call to the proxy; headers are name, value pairs.
func geminiPost(t *testing.T, target, body string, headers ...string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, target, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
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

// streamUsage is the cumulative usageMetadata after i of n chunks of 7
// output tokens each: 30 prompt tokens throughout.
func streamUsage(i int) string {
	return fmt.Sprintf(`{"promptTokenCount":30,"candidatesTokenCount":%d,"totalTokenCount":%d}`, 7*i, 30+7*i)
}

// TestGeminiStreamsChargedOnce: a stream of N chunks, each restating the
// cumulative usage, is settled once at the last usage, never the sum: the
// SDK's alt=sse stream (AI Studio and Vertex AI) and the default JSON
// array stream of a raw call; eight streams at once settle each exactly
// once, and the balance moves by exactly their sum.
func TestGeminiStreamsChargedOnce(t *testing.T) {
	t.Parallel()
	const n = 6
	b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		if !strings.HasSuffix(r.URL.Path, ":streamGenerateContent") {
			t.Errorf("upstream path %s", r.URL.Path)
		}
		if r.URL.Query().Get("alt") == "sse" {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := 1; i <= n; i++ {
				finish := ""
				if i == n {
					finish = "STOP"
				}
				fmt.Fprintf(w, "data: %s\r\n\r\n", geminiAnswer(fmt.Sprintf("part %d ", i), finish, streamUsage(i)))
				w.(http.Flusher).Flush()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, "[")
		for i := 1; i <= n; i++ {
			if i > 1 {
				fmt.Fprint(w, ",\r\n")
			}
			finish := ""
			if i == n {
				finish = "STOP"
			}
			fmt.Fprint(w, geminiAnswer(fmt.Sprintf("part %d ", i), finish, streamUsage(i)))
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "]")
	}
	const calls = 8
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := range calls {
		wg.Add(1)
		go func(vertex bool) {
			defer wg.Done()
			var text strings.Builder
			chunks := 0
			for resp, err := range b.geminiClient(t, vertex, 0).Models.GenerateContentStream(ctx, geminiModel, genai.Text("Count."),
				&genai.GenerateContentConfig{MaxOutputTokens: 100}) {
				if err != nil {
					errs <- err
					return
				}
				chunks++
				text.WriteString(resp.Text())
			}
			if chunks != n || !strings.HasPrefix(text.String(), "part 1 part 2") {
				errs <- fmt.Errorf("%d chunks, %q", chunks, text.String())
			}
		}(i%2 == 1)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	status, h, raw := geminiPost(t, b.base+"/v1beta/models/"+geminiModel+":streamGenerateContent",
		`{"contents":[{"parts":[{"text":"Count."}]}],"generationConfig":{"maxOutputTokens":100}}`, "X-Goog-Api-Key", b.key)
	var arr []map[string]any
	if status != http.StatusOK || json.Unmarshal([]byte(raw), &arr) != nil || len(arr) != n || h.Get("X-Tokengate-Admission") == "" {
		t.Fatalf("JSON array stream: %d %s", status, raw)
	}
	as := b.admissions(t)
	if len(as) != calls+1 {
		t.Fatalf("%d admissions, want %d", len(as), calls+1)
	}
	var spent int64
	for i, a := range as {
		if a.State != account.StateSettled || *a.ActualInput != 30 || *a.ActualOutput != 7*n {
			t.Fatalf("admission %d: %+v; want settled at the last usage, 30 in and %d out (the sum of the chunks would be %d)", i, a, 7*n, 7*n*(n+1)/2)
		}
		spent += *a.ActualCost
	}
	if got, want := len(b.spy.settled()), calls+1; got != want {
		t.Fatalf("%d settles, want %d: one a stream", got, want)
	}
	if got := b.balance(t); got != 100_000-spent || spent != int64(calls+1)*(30+7*n) {
		t.Fatalf("balance %d after %d spent, want %d", got, spent, 100_000-int64(calls+1)*(30+7*n))
	}
	b.verify(t)
}

// TestGeminiCountTokens: countTokens, through the SDK on both backends
// and raw, is answered with the estimate's input, never reaches the
// upstream and admits nothing.
func TestGeminiCountTokens(t *testing.T) {
	t.Parallel()
	b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	var h geminiHeard
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) { h.add(r) }
	text := "How many tokens is this sentence?"
	req, err := estimator.ParseGeminiCount(geminiModel, []byte(`{"contents":[{"role":"user","parts":[{"text":"`+text+`"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want, err := b.est.Estimate(req)
	if err != nil {
		t.Fatal(err)
	}
	for _, vertex := range []bool{false, true} {
		resp, err := b.geminiClient(t, vertex, 0).Models.CountTokens(ctx, geminiModel, genai.Text(text), nil)
		if err != nil || int64(resp.TotalTokens) != want.InputTokens {
			t.Fatalf("vertex %v: %+v, %v; want %d", vertex, resp, err, want.InputTokens)
		}
	}
	status, hd, raw := geminiPost(t, b.base+"/v1beta/models/"+geminiModel+":countTokens?key="+b.key, `{"contents":[{"parts":[{"text":"`+text+`"}]}]}`)
	if status != http.StatusOK || hd.Get("X-Tokengate-Count") != "estimate" || !strings.Contains(raw, fmt.Sprintf(`"totalTokens":%d`, want.InputTokens)) {
		t.Fatalf("raw count: %d %v %s", status, hd, raw)
	}
	if n := len(b.admissions(t)); n != 0 || h.count() != 0 {
		t.Fatalf("%d admissions, %d upstream calls", n, h.count())
	}
}

// googleDetail is the detail of type typ in a Google error's details.
func googleDetail(details []map[string]any, typ string) map[string]any {
	for _, d := range details {
		if d["@type"] == "type.googleapis.com/google.rpc."+typ {
			return d
		}
	}
	return nil
}

// TestGeminiRefusalAndTheSDKRetries: a call over the allowance is
// Google's 429 RESOURCE_EXHAUSTED with an ErrorInfo and a RetryInfo
// stating the wait, charging nothing; the SDK's own retry then succeeds.
// A call that can never fit is a 400 FAILED_PRECONDITION the SDK does not
// retry; bad input a 400 INVALID_ARGUMENT naming the field; a bad key a
// 401 UNAUTHENTICATED; none reaches the upstream or moves the balance.
func TestGeminiRefusalAndTheSDKRetries(t *testing.T) {
	t.Parallel()
	// 100 tokens/s: the second call is about 350 tokens short, about 3.5 s
	// of refill, which the SDK's retry (1 s, 2 s, 4 s) outwaits.
	b := setupGemini(t, rule.Limits{TokensCapacity: 700, TokensRateMicro: 100 * rule.Micro})
	var h geminiHeard
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		h.add(r)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, geminiAnswer("ok", "STOP", `{"promptTokenCount":20,"candidatesTokenCount":500,"totalTokenCount":520}`))
	}
	config := func(max int32) *genai.GenerateContentConfig {
		return &genai.GenerateContentConfig{MaxOutputTokens: max}
	}
	if _, err := b.geminiClient(t, false, 0).Models.GenerateContent(ctx, geminiModel, genai.Text("Hello"), config(500)); err != nil {
		t.Fatal(err)
	}
	_, err := b.geminiClient(t, false, 0).Models.GenerateContent(ctx, geminiModel, genai.Text("Hello"), config(500))
	var apiErr genai.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != http.StatusTooManyRequests || apiErr.Status != "RESOURCE_EXHAUSTED" {
		t.Fatalf("over the allowance: %v", err)
	}
	info, retry := googleDetail(apiErr.Details, "ErrorInfo"), googleDetail(apiErr.Details, "RetryInfo")
	if info == nil || info["reason"] != "RATE_LIMIT_EXCEEDED" || info["domain"] != "tokengate" || retry == nil ||
		!strings.HasSuffix(fmt.Sprint(retry["retryDelay"]), "s") || fmt.Sprint(retry["retryDelay"]) == "0s" {
		t.Fatalf("429 details: %+v", apiErr.Details)
	}
	if _, err := b.geminiClient(t, false, 4).Models.GenerateContent(ctx, geminiModel, genai.Text("Hello"), config(500)); err != nil {
		t.Fatalf("the SDK's retry: %v", err)
	}
	if got := counterValue(t, b.reg, "refused"); got < 2 {
		t.Fatalf("%v refusals: the SDK's retry was never refused, so it was not what admitted the call", got)
	}
	if as := b.admissions(t); len(as) != 2 || h.count() != 2 {
		t.Fatalf("%d admissions, %d upstream calls; the refusals must not count", len(as), h.count())
	}
	before, err := ledger.Verify(ctx, b.pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	// Never fits: 800 output tokens against a capacity of 700 (and the SDK,
	// retrying, would call again: it does not).
	_, err = b.geminiClient(t, true, 4).Models.GenerateContent(ctx, geminiModel, genai.Text("Hello"), config(800))
	if !errors.As(err, &apiErr) || apiErr.Code != http.StatusBadRequest || apiErr.Status != "FAILED_PRECONDITION" {
		t.Fatalf("never fits: %v", err)
	}
	// Bad input names its field, in a BadRequest.
	status, _, raw := geminiPost(t, b.base+"/v1beta/models/"+geminiModel+":generateContent", `{"contents":[{"parts":[{"text":5}]}]}`, "X-Goog-Api-Key", b.key)
	var ge struct {
		Error genai.APIError `json:"error"`
	}
	if json.Unmarshal([]byte(raw), &ge) != nil || status != http.StatusBadRequest || ge.Error.Status != "INVALID_ARGUMENT" || ge.Error.Code != 400 ||
		fmt.Sprint(googleDetail(ge.Error.Details, "BadRequest")["fieldViolations"]) != "[map[description:contents[0].parts[0].text: must be a string field:contents[0].parts[0].text]]" {
		t.Fatalf("bad input: %d %s", status, raw)
	}
	status, _, raw = geminiPost(t, b.base+"/v1beta/models/"+geminiModel+":generateContent", `{"contents":[{"parts":[{"text":"hi"}]}]}`, "X-Goog-Api-Key", "tg_wrong")
	if json.Unmarshal([]byte(raw), &ge) != nil || status != http.StatusUnauthorized || ge.Error.Status != "UNAUTHENTICATED" {
		t.Fatalf("bad key: %d %s", status, raw)
	}
	after, err := ledger.Verify(ctx, b.pool, "acme")
	if as := b.admissions(t); err != nil || len(as) != 2 || h.count() != 2 || after.LastSeq != before.LastSeq {
		t.Fatalf("%d admissions, %d upstream calls, ledger at %d (was %d, %v) after calls refused", len(as), h.count(), after.LastSeq, before.LastSeq, err)
	}
	b.verify(t)
}

// TestGeminiUpstreamErrorAndBrokenStream: Google's own 503 is relayed as
// it is (the SDK reads its error) and the reservation released; a stream
// the upstream breaks off is settled at its last usage, raised to the
// text streamed so far counted as the estimate counts, and broken off to
// the SDK too.
func TestGeminiUpstreamErrorAndBrokenStream(t *testing.T) {
	t.Parallel()
	t.Run("upstream error", func(t *testing.T) {
		t.Parallel()
		b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
		b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"error":{"code":503,"message":"The model is overloaded.","status":"UNAVAILABLE"}}`)
		}
		_, err := b.geminiClient(t, false, 0).Models.GenerateContent(ctx, geminiModel, genai.Text("Hello"), &genai.GenerateContentConfig{MaxOutputTokens: 100})
		var apiErr genai.APIError
		if !errors.As(err, &apiErr) || apiErr.Code != http.StatusServiceUnavailable || apiErr.Message != "The model is overloaded." {
			t.Fatalf("relayed: %v", err)
		}
		b.eventually(t, func(a *account.Admission) bool { return a.State == account.StateReleased })
		if got := b.balance(t); got != 100_000 {
			t.Fatalf("balance %d after a released call", got)
		}
		b.verify(t)
	})
	t.Run("blocked prompt", func(t *testing.T) {
		t.Parallel()
		b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
		b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"promptFeedback\":{\"blockReason\":\"SAFETY\"},\"usageMetadata\":{\"promptTokenCount\":30,\"totalTokenCount\":30}}\r\n\r\n")
		}
		chunks := 0
		for _, err := range b.geminiClient(t, false, 0).Models.GenerateContentStream(ctx, geminiModel, genai.Text("Explain."), &genai.GenerateContentConfig{MaxOutputTokens: 1000}) {
			if err != nil {
				t.Fatalf("a blocked prompt's stream, whole: %v", err)
			}
			chunks++
		}
		a := b.admissions(t)[0]
		if chunks != 1 || a.State != account.StateSettled || *a.ActualInput != 30 || *a.ActualOutput != 0 {
			t.Fatalf("%d chunks; admission %+v: want settled before the stream ended, 30 in, 0 out", chunks, a)
		}
		b.verify(t)
	})
	t.Run("broken stream", func(t *testing.T) {
		t.Parallel()
		b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
		chunks := []string{"The gateway admits ", "requests only when ", "the tenant's bucket allows them."}
		b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
			w.Header().Set("Content-Type", "text/event-stream")
			for i, c := range chunks {
				fmt.Fprintf(w, "data: %s\r\n\r\n", geminiAnswer(c, "", fmt.Sprintf(`{"promptTokenCount":30,"candidatesTokenCount":%d,"totalTokenCount":%d}`, i+1, 31+i)))
				w.(http.Flusher).Flush()
			}
			panic(http.ErrAbortHandler) // the connection drops mid-stream
		}
		var err error
		for _, err = range b.geminiClient(t, false, 0).Models.GenerateContentStream(ctx, geminiModel, genai.Text("Explain."), &genai.GenerateContentConfig{MaxOutputTokens: 1000}) {
			if err != nil {
				break
			}
		}
		if err == nil {
			t.Fatal("the SDK saw no error")
		}
		b.settledAtStreamed(t, chunks)
		b.verify(t)
	})
}

// TestGeminiToolUseEstimatedAsForwarded: a tool-use turn through the SDK
// (a function declaration, the model's functionCall, the caller's
// functionResponse, an image inline and a file) is estimated exactly as
// the body the upstream received parses, its media as parts and never as
// base64 text, and the answer's functionCall reaches the SDK; the call
// settles from its usage.
func TestGeminiToolUseEstimatedAsForwarded(t *testing.T) {
	t.Parallel()
	b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	var forwarded []byte
	var mu sync.Mutex
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		raw, _ := json.Marshal(body)
		mu.Lock()
		forwarded = raw
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"candidates":[{"index":0,"finishReason":"STOP","content":{"role":"model","parts":[{"functionCall":{"name":"get_weather","args":{"city":"Oslo"}}}]}}],`+
			`"usageMetadata":{"promptTokenCount":400,"candidatesTokenCount":12,"totalTokenCount":412}}`)
	}
	image := make([]byte, 300_000) // as base64, 400 KB: about 100k tokens were it counted as text
	contents := []*genai.Content{
		genai.NewContentFromParts([]*genai.Part{genai.NewPartFromText("What is the weather in Paris, and in this picture?"),
			genai.NewPartFromBytes(image, "image/png"), genai.NewPartFromURI("gs://bucket/forecast.pdf", "application/pdf")}, genai.RoleUser),
		genai.NewContentFromParts([]*genai.Part{genai.NewPartFromFunctionCall("get_weather", map[string]any{"city": "Paris"})}, genai.RoleModel),
		genai.NewContentFromParts([]*genai.Part{genai.NewPartFromFunctionResponse("get_weather", map[string]any{"temp_c": 21, "sky": "clear"})}, genai.RoleUser),
	}
	config := &genai.GenerateContentConfig{MaxOutputTokens: 256, Tools: []*genai.Tool{{FunctionDeclarations: []*genai.FunctionDeclaration{{
		Name: "get_weather", Description: "The weather in a city",
		Parameters: &genai.Schema{Type: genai.TypeObject, Properties: map[string]*genai.Schema{"city": {Type: genai.TypeString}}, Required: []string{"city"}}}}}}}
	resp, err := b.geminiClient(t, false, 0).Models.GenerateContent(ctx, geminiModel, contents, config)
	if err != nil {
		t.Fatal(err)
	}
	if calls := resp.FunctionCalls(); len(calls) != 1 || calls[0].Name != "get_weather" || calls[0].Args["city"] != "Oslo" {
		t.Fatalf("function calls: %+v", calls)
	}
	mu.Lock()
	req, err := estimator.ParseGemini(geminiModel, forwarded)
	mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	want, err := b.est.Estimate(req)
	if err != nil {
		t.Fatal(err)
	}
	a := b.admissions(t)[0]
	if a.Estimate.InputTokens != want.InputTokens || a.Estimate.OutputTokens != 256 || want.InputTokens < 2*1120 || want.InputTokens > 2*1120+200 {
		t.Fatalf("estimated %+v; the forwarded body parses to %+v (want two media parts at 1120 and the text, never the base64)", a.Estimate, want)
	}
	if a.State != account.StateSettled || *a.ActualInput != 400 || *a.ActualOutput != 12 {
		t.Fatalf("admission: %+v", a)
	}
	b.verify(t)
}
