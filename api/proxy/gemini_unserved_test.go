package proxy_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/genai"

	"github.com/tokengate/tokengate/budget/rule"
)

// TestGeminiUnservedPathsAnswerInGooglesShape: a path of the Gemini API's
// the proxy does not serve (a model's GET, the models list, cached
// contents, Vertex AI's :predict, any other method) is a 404 NOT_FOUND in
// Google's error shape, which the SDK reads as its APIError; it never
// reaches the upstream and admits nothing. A /v1 path that is not Gemini's
// stays OpenAI's 404.
func TestGeminiUnservedPathsAnswerInGooglesShape(t *testing.T) {
	t.Parallel()
	b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	var heard geminiHeard
	b.up.behave = func(w http.ResponseWriter, r *http.Request, _ map[string]any) { heard.add(r) }
	_, err := b.geminiClient(t, false, 0).Models.Get(ctx, geminiModel, nil)
	var apiErr genai.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != http.StatusNotFound || apiErr.Status != "NOT_FOUND" {
		t.Fatalf("the SDK's Models.Get: %v", err)
	}
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/v1beta/models/" + geminiModel},
		{http.MethodGet, "/v1beta/models"},
		{http.MethodPost, "/v1beta/cachedContents"},
		{http.MethodPost, "/v1beta/models/" + geminiModel + ":generateAnswer"},
		{http.MethodPost, "/v1/projects/p/locations/us-central1/publishers/google/models/text-embedding-005:predict"},
		{http.MethodPost, "/v1/models/" + geminiModel + ":predict"},
	} {
		req, _ := http.NewRequest(c.method, b.base+c.path, strings.NewReader(`{}`))
		req.Header.Set("X-Goog-Api-Key", b.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var g struct {
			Error struct {
				Code    int              `json:"code"`
				Status  string           `json:"status"`
				Message string           `json:"message"`
				Details []map[string]any `json:"details"`
			} `json:"error"`
		}
		derr := json.NewDecoder(resp.Body).Decode(&g)
		resp.Body.Close()
		if derr != nil || resp.StatusCode != http.StatusNotFound || g.Error.Code != http.StatusNotFound || g.Error.Status != "NOT_FOUND" ||
			!strings.Contains(g.Error.Message, c.path) || len(g.Error.Details) == 0 || g.Error.Details[0]["reason"] != "NOT_FOUND" {
			t.Errorf("%s %s: %d %+v %v; want Google's 404 NOT_FOUND naming the path", c.method, c.path, resp.StatusCode, g, derr)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, b.base+"/v1/models/"+geminiModel, strings.NewReader(`{}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var o struct {
		Error struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"error"`
	}
	derr := json.NewDecoder(resp.Body).Decode(&o)
	resp.Body.Close()
	if derr != nil || resp.StatusCode != http.StatusNotFound || o.Error.Type != "not_found" || o.Error.Status != "" {
		t.Errorf("/v1/models/...: %d %+v %v; want OpenAI's 404", resp.StatusCode, o, derr)
	}
	if heard.count() != 0 || len(b.admissions(t)) != 0 {
		t.Fatalf("%d upstream calls, %d admissions; want none", heard.count(), len(b.admissions(t)))
	}
}
