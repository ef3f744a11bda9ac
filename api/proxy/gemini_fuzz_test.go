package proxy_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// geminiRoutes are the Gemini wire's routes, AI Studio's and Vertex AI's.
var geminiRoutes = []string{
	"/v1beta/models/gemini-2.5-flash:generateContent",
	"/v1beta/models/gemini-2.5-pro:streamGenerateContent",
	"/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
	"/v1beta/models/gemini-2.0-flash:countTokens",
	"/v1/projects/p/locations/us-central1/publishers/google/models/gemini-3-pro-preview:generateContent",
	"/v1beta1/projects/p/locations/global/publishers/google/models/gemini-2.5-flash:countTokens",
	"/v1beta/models/gemini-embedding-001:embedContent",
	"/v1beta1/projects/p/locations/us-central1/publishers/google/models/gemini-embedding-001:batchEmbedContents",
}

// FuzzGeminiBodies sends arbitrary bodies to the Gemini wire, in front of
// an upstream that answers every call with usage. Whatever the body: never
// a 5xx (the upstream never fails here); every 4xx is Google's error
// ({"error":{"code","message","status","details"}}, its code the HTTP
// status); a refused call moves no balance, writes no ledger row and never
// reaches the upstream; and countTokens never does either, whatever it
// answers.
func FuzzGeminiBodies(f *testing.F) {
	for _, s := range []string{
		`{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"generationConfig":{"maxOutputTokens":50}}`,
		`{"systemInstruction":{"parts":[{"text":"be brief"}]},"contents":[{"role":"user","parts":[{"text":"a"},{"inlineData":{"mimeType":"image/png","data":"iVBORw0KGgo="}},` +
			`{"fileData":{"mimeType":"application/pdf","fileUri":"gs://b/f"}}]},{"role":"model","parts":[{"functionCall":{"name":"w","args":{"c":"P"}},"thoughtSignature":"c2ln"}]},` +
			`{"role":"user","parts":[{"functionResponse":{"name":"w","response":{"t":1}}}]}],"tools":[{"functionDeclarations":[{"name":"w","parameters":{"type":"object"}}]},{"googleSearch":{}}],` +
			`"generationConfig":{"maxOutputTokens":100,"candidateCount":2,"thinkingConfig":{"thinkingBudget":-1,"thinkingLevel":"high"}}}`,
		`{"generateContentRequest":{"model":"models/gemini-2.5-flash","contents":[{"parts":[{"text":"x"}]}]}}`,
		`{"contents":[],"generationConfig":{"maxOutputTokens":0}}`,
		`{"contents":[{"parts":[{"text":"hi"}]}],"generationConfig":{"maxOutputTokens":9223372036854775808,"candidateCount":1e300}}`,
		`{"contents":[{"parts":[{"text":"a\u0000b"}]}]} trailing`,
		`{"contents":[{"parts":[{"executableCode":{"code":5}}]}]}`,
		`{"contents":[{"parts":[{}]}],"tools":[{"functionDeclarations":{}}]}`,
		`{"content":{"parts":[{"text":"embed me"}]},"taskType":"RETRIEVAL_DOCUMENT","title":"t","outputDimensionality":768}`,
		`{"requests":[{"model":"models/gemini-embedding-001","content":{"parts":[{"text":"a"}]}},{"content":{"parts":[{"text":5}]}}]}`,
	} {
		for i := range geminiRoutes {
			f.Add(uint8(i), s)
		}
	}
	b := setupGemini(f, rule.Limits{TokensCapacity: 1_000_000_000, TokensRateMicro: rule.Micro})
	var calls atomic.Int64
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		calls.Add(1)
		answer := geminiAnswer("ok", "STOP", `{"promptTokenCount":5,"candidatesTokenCount":3,"totalTokenCount":8}`)
		if r.URL.Query().Get("alt") == "sse" {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: %s\r\n\r\n", answer)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, ":streamGenerateContent") {
			answer = "[" + answer + "]"
		}
		fmt.Fprint(w, answer)
	}
	f.Fuzz(func(t *testing.T, route uint8, body string) {
		path := geminiRoutes[int(route)%len(geminiRoutes)]
		before, _ := ledger.Verify(ctx, b.pool, "acme")
		callsBefore := calls.Load()
		status, _, raw := geminiPost(t, b.base+path, body, "X-Goog-Api-Key", b.key)
		if status >= 500 {
			t.Fatalf("%s %q: %d %s", path, body, status, raw)
		}
		if strings.Contains(path, ":countTokens") {
			after, err := ledger.Verify(ctx, b.pool, "acme")
			if err != nil || after.LastSeq != before.LastSeq || calls.Load() != callsBefore {
				t.Fatalf("countTokens %q: %d, yet the ledger moved from %d to %d or the upstream was called (%v)", body, status, before.LastSeq, after.LastSeq, err)
			}
		}
		if status < 400 {
			return
		}
		var ge struct {
			Error *struct {
				Code    int              `json:"code"`
				Message string           `json:"message"`
				Status  string           `json:"status"`
				Details []map[string]any `json:"details"`
			} `json:"error"`
		}
		if json.Unmarshal([]byte(raw), &ge) != nil || ge.Error == nil || ge.Error.Code != status || ge.Error.Status == "" || ge.Error.Message == "" ||
			googleDetail(ge.Error.Details, "ErrorInfo") == nil {
			t.Fatalf("%s %q: %d without Google's error: %s", path, body, status, raw)
		}
		after, err := ledger.Verify(ctx, b.pool, "acme")
		if err != nil || after.LastSeq != before.LastSeq || after.BalanceMicro != before.BalanceMicro {
			t.Fatalf("%s %q: refused with %d, yet the ledger moved from %d to %d (%v)", path, body, status, before.LastSeq, after.LastSeq, err)
		}
		if calls.Load() != callsBefore {
			t.Fatalf("%s %q: refused with %d, yet the upstream was called", path, body, status)
		}
	})
}
