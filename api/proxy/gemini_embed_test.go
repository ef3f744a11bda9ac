package proxy_test

import (
	"net/http"
	"strings"
	"testing"

	"google.golang.org/genai"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// geminiEmbedModel is Google's current embedding model, seeded with its
// 2048-token window.
const geminiEmbedModel = "gemini-embedding-001"

// geminiTextCount is a Gemini text as the estimate counts it: o200k_base
// times the stated factor.
func geminiTextCount(t *testing.T, text string) int64 {
	t.Helper()
	n, err := estimator.CountText(estimator.EncodingO200K, text)
	if err != nil {
		t.Fatal(err)
	}
	return estimator.ScaleGeminiCount(int64(n))
}

// TestGeminiEmbeddings: the SDK's EmbedContent, on AI Studio (always
// :batchEmbedContents) and Vertex AI (:embedContent for one content,
// :batchEmbedContents for several), is admitted for its input alone: each
// content's text counted as Gemini's texts are, no output reserved, a
// content over the model's window charged at the window (Google truncates
// it), never refused. AI Studio's answers state no usage, so the call
// settles at its estimate; Vertex AI's state promptTokenCount, which it
// settles at. The balance moves by exactly the settled input.
func TestGeminiEmbeddings(t *testing.T) {
	t.Parallel()
	b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	var heard geminiHeard
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		heard.add(r)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, ":embedContent"):
			w.Write([]byte(`{"embedding":{"values":[0.1,0.2]},"usageMetadata":{"promptTokenCount":5,"totalTokenCount":5},"truncated":false}`))
		case strings.HasPrefix(r.URL.Path, "/v1beta1/projects/"):
			w.Write([]byte(`{"embeddings":[{"values":[0.1]},{"values":[0.2]}],"usageMetadata":{"promptTokenCount":9,"totalTokenCount":9}}`))
		default:
			reqs, _ := body["requests"].([]any)
			w.Write([]byte(`{"embeddings":[` + strings.TrimSuffix(strings.Repeat(`{"values":[0.1,0.2]},`, len(reqs)), ",") + `]}`))
		}
	}
	long := strings.Repeat("tokengate admits each request against the tenant's budget. ", 300)
	texts := []*genai.Content{genai.NewContentFromText("The quick brown fox.", genai.RoleUser), genai.NewContentFromText(long, genai.RoleUser)}
	studio, vertex := b.geminiClient(t, false, 0), b.geminiClient(t, true, 0)
	resp, err := studio.Models.EmbedContent(ctx, geminiEmbedModel, texts, nil)
	if err != nil || len(resp.Embeddings) != 2 {
		t.Fatalf("AI Studio: %+v %v", resp, err)
	}
	if _, err := vertex.Models.EmbedContent(ctx, geminiEmbedModel, genai.Text("Hello, world."), nil); err != nil {
		t.Fatalf("Vertex AI, one: %v", err)
	}
	if _, err := vertex.Models.EmbedContent(ctx, geminiEmbedModel, texts, nil); err != nil {
		t.Fatalf("Vertex AI, several: %v", err)
	}
	if got := geminiTextCount(t, long); got <= 2048 {
		t.Fatalf("the long text counts %d, want over the window", got)
	}
	want := []struct {
		path          string
		estimate, out int64 // the reserved input, and the settled one
	}{
		{"/v1/models/" + geminiEmbedModel + ":batchEmbedContents", geminiTextCount(t, "The quick brown fox.") + 2048, geminiTextCount(t, "The quick brown fox.") + 2048},
		{"/v1beta1/projects/proj/locations/us-central1/publishers/google/models/" + geminiEmbedModel + ":embedContent", geminiTextCount(t, "Hello, world."), 5},
		{"/v1beta1/projects/proj/locations/us-central1/publishers/google/models/" + geminiEmbedModel + ":batchEmbedContents", geminiTextCount(t, "The quick brown fox.") + 2048, 9},
	}
	as := b.admissions(t)
	if len(as) != len(want) || heard.count() != len(want) {
		t.Fatalf("%d admissions, %d upstream calls; want %d", len(as), heard.count(), len(want))
	}
	var spent int64
	for i, w := range want {
		a := as[i]
		if heard.urls[i].Path != w.path {
			t.Errorf("call %d went to %s, want %s", i, heard.urls[i].Path, w.path)
		}
		if a.State != account.StateSettled || a.Estimate.InputTokens != w.estimate || a.Estimate.OutputTokens != 0 || !a.Estimate.Approximate ||
			*a.ActualInput != w.out || *a.ActualOutput != 0 {
			t.Errorf("call %d: %s, estimated %d in / %d out, settled %d / %d; want %d / 0, settled %d / 0",
				i, a.State, a.Estimate.InputTokens, a.Estimate.OutputTokens, *a.ActualInput, *a.ActualOutput, w.estimate, w.out)
		}
		spent += *a.ActualCost
	}
	if got := b.balance(t); got != 100_000-spent {
		t.Fatalf("balance %d, want %d", got, 100_000-spent)
	}
	b.verify(t)
}

// TestGeminiEmbeddingsBadInput: an embedding body that cannot be read is
// a 400 INVALID_ARGUMENT in Google's shape naming its field, never
// forwarded and never debited.
func TestGeminiEmbeddingsBadInput(t *testing.T) {
	t.Parallel()
	b := setupGemini(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	var heard geminiHeard
	b.up.behave = func(w http.ResponseWriter, r *http.Request, _ map[string]any) { heard.add(r) }
	for _, c := range []struct{ action, body, field string }{
		{"embedContent", `{}`, "content"},
		{"embedContent", `{"content":{"parts":[]}}`, "content.parts"},
		{"embedContent", `{"content":{"parts":[{"text":7}]}}`, "content.parts[0].text"},
		{"embedContent", `{"content":{"parts":[{"text":"a"}]},"outputDimensionality":"big"}`, "outputDimensionality"},
		{"batchEmbedContents", `{"requests":[]}`, "requests"},
		{"batchEmbedContents", `{"requests":[{"content":{"parts":[{"text":"a"}]}},{"content":"b"}]}`, "requests[1].content"},
	} {
		status, _, raw := geminiPost(t, b.base+"/v1beta/models/"+geminiEmbedModel+":"+c.action, c.body, "X-Goog-Api-Key", b.key)
		if status != http.StatusBadRequest || !strings.Contains(raw, `"INVALID_ARGUMENT"`) || !strings.Contains(raw, `"field":"`+c.field+`"`) {
			t.Errorf("%s %s: %d %s; want 400 INVALID_ARGUMENT naming %s", c.action, c.body, status, raw, c.field)
		}
	}
	if heard.count() != 0 || b.balance(t) != 100_000 {
		t.Fatalf("%d upstream calls, balance %d; want none, 100000", heard.count(), b.balance(t))
	}
}
