package proxy_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
)

// TestModelScopesOnEveryWire: a model outside the tenant's scope, or its
// key's, is refused on each wire (OpenAI, Anthropic, Gemini) with a 403 in
// the wire's own error shape naming the model and its field, before the
// upstream is called and with nothing debited; each refusal is counted as
// rejected by model_scope. A model the scopes allow goes through.
func TestModelScopesOnEveryWire(t *testing.T) {
	t.Parallel()
	const capacity = 1_000_000
	b := setupGemini(t, rule.Limits{TokensCapacity: capacity, TokensRateMicro: 1})
	var calls atomic.Int64
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"c","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`))
	}
	if _, err := b.store.SetModels(ctx, account.SetModelsParams{TenantID: "acme", Models: []string{"gpt-4o*"}}); err != nil {
		t.Fatal(err)
	}
	refusals := 0
	refused := func(name string, status int, raw string, want ...string) {
		t.Helper()
		refusals++
		if status != http.StatusForbidden {
			t.Fatalf("%s: %d %s, want 403", name, status, raw)
		}
		for _, w := range want {
			if !strings.Contains(raw, w) {
				t.Fatalf("%s: %s, want it to hold %q", name, raw, w)
			}
		}
	}

	// OpenAI: error.code model_not_allowed, param model.
	status, h, raw := b.post(t, `{"model":"gpt-3.5-turbo","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)
	refused("openai", status, raw, `"code":"model_not_allowed"`, `"param":"model"`, `gpt-3.5-turbo`, "tenant acme")
	var oe struct {
		Error struct{ Type, Code, Param string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(raw), &oe); err != nil || oe.Error.Type != "model_not_allowed" || oe.Error.Code != "model_not_allowed" || oe.Error.Param != "model" {
		t.Fatalf("openai: %s is not OpenAI's error shape", raw)
	}
	if h.Get("X-Should-Retry") != "false" {
		t.Fatalf("openai: X-Should-Retry %q, want false", h.Get("X-Should-Retry"))
	}
	// Anthropic: a permission_error naming the field.
	status, raw = b.postMessages(t, `{"model":"`+claudeModel+`","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)
	refused("anthropic", status, raw, `"type":"error"`, `"type":"permission_error"`, "model_not_allowed", claudeModel)
	// Gemini: PERMISSION_DENIED with the reason MODEL_NOT_ALLOWED.
	status, _, raw = geminiPost(t, b.base+"/v1beta/models/"+geminiModel+":generateContent", `{"contents":[{"parts":[{"text":"hi"}]}]}`, "X-Goog-Api-Key", b.key)
	refused("gemini", status, raw, `"status":"PERMISSION_DENIED"`, `"reason":"MODEL_NOT_ALLOWED"`, geminiModel)

	// The key narrows the tenant: gpt-4o* for the tenant, gpt-4o-mini for
	// the key.
	id, _, _ := credential.Parse(credential.KeyPrefix, b.key)
	if _, err := credential.KeySetModelsRecorded(ctx, b.store, "acme", id, []string{"gpt-4o-mini"}, "admin"); err != nil {
		t.Fatal(err)
	}
	status, _, raw = b.post(t, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)
	refused("openai, the key's scope", status, raw, `"code":"model_not_allowed"`, "this API key")

	if calls.Load() != 0 {
		t.Fatalf("refused calls reached the upstream %d times", calls.Load())
	}
	if as := b.admissions(t); len(as) != 0 {
		t.Fatalf("refused calls were admitted: %+v", as)
	}
	if got := b.balance(t); got != capacity {
		t.Fatalf("balance %d after refusals, want %d: something was debited", got, capacity)
	}
	if got := testutil.ToFloat64(b.admitter.Admissions(admission.FaceProxy, "rejected", "model_scope")); got != float64(refusals) {
		t.Fatalf("tokengate_admissions_total{face=proxy,outcome=rejected,limit=model_scope} = %v, want %d", got, refusals)
	}

	// Allowed by both: admitted and forwarded.
	if status, _, raw := b.post(t, `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`); status != http.StatusOK {
		t.Fatalf("an allowed model: %d %s", status, raw)
	}
	if calls.Load() != 1 || len(b.admissions(t)) != 1 {
		t.Fatalf("the allowed call: %d upstream calls, %d admissions", calls.Load(), len(b.admissions(t)))
	}
}

// TestModelScopeRefusesABatchLine: a batch input file with one line whose
// model the tenant may not use is refused whole, with a 403 naming the
// line, its custom_id and the model; the file never reaches the upstream.
// The same model is refused as a single call: one rule for both.
func TestModelScopeRefusesABatchLine(t *testing.T) {
	t.Parallel()
	b := setupBatches(t, 100_000)
	if _, err := b.store.SetModels(ctx, account.SetModelsParams{TenantID: "acme", Models: []string{"gpt-4o"}}); err != nil {
		t.Fatal(err)
	}
	_, err := b.upload(t, chatLine("a", "gpt-4o", 10), chatLine("b", "gpt-4o", 10), chatLine("c", "gpt-4o-mini", 10))
	lineError(t, err, http.StatusForbidden, "line 3")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.Code != "model_not_allowed" {
		t.Fatalf("%v: want the code model_not_allowed", err)
	}
	for _, want := range []string{"line 3", `custom_id "c"`, "body.model", "gpt-4o-mini"} {
		if !strings.Contains(apiErr.Message, want) {
			t.Fatalf("%q: want it to hold %q", apiErr.Message, want)
		}
	}
	if b.up.uploads != 0 || b.enqueued(t) != 0 {
		t.Fatalf("a refused file: %d uploads, %d enqueued", b.up.uploads, b.enqueued(t))
	}
	// The key's scope binds batch lines too.
	if _, err := b.store.SetModels(ctx, account.SetModelsParams{TenantID: "acme"}); err != nil {
		t.Fatal(err)
	}
	id, _, _ := credential.Parse(credential.KeyPrefix, b.key)
	if _, err := credential.KeySetModelsRecorded(ctx, b.store, "acme", id, []string{"gpt-4o"}, "admin"); err != nil {
		t.Fatal(err)
	}
	_, err = b.upload(t, chatLine("a", "gpt-4o-mini", 10))
	lineError(t, err, http.StatusForbidden, "line 1")
	if _, err := b.upload(t, chatLine("a", "gpt-4o", 10)); err != nil {
		t.Fatalf("an allowed file: %v", err)
	}

	// A file uploaded while the key could use both models is batched after
	// its scope narrowed: the create checks the lines again, under the
	// tenant's lock, and refuses the batch naming the line; nothing is
	// enqueued and the upstream gets no batch.
	if _, err := credential.KeySetModelsRecorded(ctx, b.store, "acme", id, nil, "admin"); err != nil {
		t.Fatal(err)
	}
	f, err := b.upload(t, chatLine("a", "gpt-4o", 10), chatLine("b", "gpt-4o-mini", 10))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := credential.KeySetModelsRecorded(ctx, b.store, "acme", id, []string{"gpt-4o"}, "admin"); err != nil {
		t.Fatal(err)
	}
	_, err = b.create(t, f.ID)
	lineError(t, err, http.StatusForbidden, "line 2")
	if !errors.As(err, &apiErr) || apiErr.Code != "model_not_allowed" {
		t.Fatalf("create: %v, want model_not_allowed", err)
	}
	if b.enqueued(t) != 0 || len(b.up.batches) != 0 {
		t.Fatalf("a refused batch: %d enqueued, %d upstream batches", b.enqueued(t), len(b.up.batches))
	}
}
