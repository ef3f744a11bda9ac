package proxy

// The Gemini API (`--gemini-upstream URL`): Google's genai SDKs, and
// plain REST callers, point their base URL at the proxy and use a tenant
// key as their API key. A call of models/{model}:generateContent or
// :streamGenerateContent, on AI Studio's paths (/v1beta/models/...) or
// Vertex AI's (/v1/projects/{p}/locations/{l}/publishers/google/models/...),
// is admitted on the same path as the other wires, forwarded with
// tokengate's own Gemini key, and settled from Gemini's usageMetadata.
// :countTokens is answered from the estimator and never debits;
// :embedContent and :batchEmbedContents are admitted for their input
// alone. Any other path of the API is answered 404 NOT_FOUND in Google's
// shape.

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// gemini is Google's Gemini wire: the model in the URL's path, the
// tenant's key in x-goog-api-key, ?key= or a bearer token (never sent
// upstream: tokengate's key goes as x-goog-api-key), Google's error shape
// (google.rpc.Status with ErrorInfo, RetryInfo and BadRequest details),
// and usageMetadata, cumulative in every chunk of a stream.
type gemini struct{}

// The Gemini API's routes, by route.api.
const (
	geminiGenerate = iota
	geminiStream
	geminiCount
	geminiEmbed
	geminiBatchEmbed
)

// geminiActions are the methods served, after the model's colon.
var geminiActions = map[string]route{
	"generateContent":       {op: "chat", api: geminiGenerate},
	"streamGenerateContent": {op: "chat", api: geminiStream},
	"countTokens":           {op: "chat", api: geminiCount, count: true},
	"embedContent":          {op: "embeddings", api: geminiEmbed},
	"batchEmbedContents":    {op: "embeddings", api: geminiBatchEmbed},
}

// geminiVersions are the API versions both surfaces serve.
var geminiVersions = map[string]bool{"v1": true, "v1beta": true, "v1beta1": true, "v1alpha": true}

// geminiModelAction is the model and the method of a Gemini path:
// /{version}/models/{model}:{method} (AI Studio),
// /{version}/publishers/google/models/{model}:{method} (Vertex AI express
// mode) or
// /{version}/projects/{p}/locations/{l}/publishers/google/models/{model}:{method}
// (Vertex AI); ok is false for any other path.
func geminiModelAction(path string) (model, action string, ok bool) {
	segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	if len(segs) < 3 || !geminiVersions[segs[0]] {
		return "", "", false
	}
	rest := segs[1:]
	if len(rest) == 8 && rest[0] == "projects" && rest[2] == "locations" && rest[1] != "" && rest[3] != "" {
		rest = rest[4:]
	}
	if len(rest) == 4 && rest[0] == "publishers" && rest[1] == "google" {
		rest = rest[2:]
	}
	if len(rest) != 2 || rest[0] != "models" {
		return "", "", false
	}
	model, action, ok = strings.Cut(rest[1], ":")
	return model, action, ok
}

// route is the method's route; any other path of the Gemini API's is
// unserved, answered in Google's shape: every path under a version only
// Google's API has (v1beta, v1beta1, v1alpha), and under v1 a model's
// method, a Vertex AI resource (projects/..., publishers/...), or any path
// of a call carrying Google's key (x-goog-api-key or ?key=: the genai
// SDKs' GET /v1/models/{model}), which OpenAI's and Anthropic's SDKs never
// send. The wires before Gemini's have routed theirs already.
func (gemini) route(r *http.Request) (route, bool) {
	if _, action, ok := geminiModelAction(r.URL.Path); ok {
		if rt, ok := geminiActions[action]; ok {
			return rt, true
		}
	}
	segs := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
	switch {
	case len(segs) < 2 || !geminiVersions[segs[0]]:
		return route{}, false
	case segs[0] != "v1", segs[1] == "projects", segs[1] == "publishers",
		segs[1] == "models" && len(segs) == 3 && strings.Contains(segs[2], ":"),
		r.Header.Get("X-Goog-Api-Key") != "", r.URL.Query().Has("key"):
		return route{unserved: true}, true
	}
	return route{}, false
}

func (gemini) upstream(cfg *Config) *url.URL { return cfg.GeminiUpstream }

// provider is OpenTelemetry's name for the Gemini API (Vertex AI's calls
// take the same wire).
func (gemini) provider() string { return "gcp.gemini" }

// key is the tenant's key: x-goog-api-key, as the genai SDKs send it,
// ?key= as REST examples do, or a bearer token (Vertex AI's SDKs send
// their credentials' token).
func (gemini) key(r *http.Request) string {
	if k := strings.TrimSpace(r.Header.Get("X-Goog-Api-Key")); k != "" {
		return k
	}
	if k := strings.TrimSpace(r.URL.Query().Get("key")); k != "" {
		return k
	}
	return bearer(r)
}

// parse reads a generateContent body (or a countTokens one, or an
// embedding one) for the model in the path.
func (gemini) parse(rt route, r *http.Request, body []byte) (*estimator.Request, error) {
	model, _, _ := geminiModelAction(r.URL.Path)
	switch rt.api {
	case geminiCount:
		return estimator.ParseGeminiCount(model, body)
	case geminiEmbed, geminiBatchEmbed:
		return estimator.ParseGeminiEmbed(model, body, rt.api == geminiBatchEmbed)
	}
	return estimator.ParseGemini(model, body)
}

// prepare forwards the body as it came: every Gemini answer, whole or
// streamed, states its usage.
func (gemini) prepare(_ *route, body []byte) ([]byte, error) { return body, nil }

// count answers countTokens with the estimate's input, as Gemini's
// {"totalTokens": N}; nothing is admitted or debited. X-Tokengate-Count
// says it is the estimate (no upstream call: Gemini's tokenizer is
// Google's alone).
func (gemini) count(_ *Proxy, w http.ResponseWriter, _ *http.Request, _ []byte, est estimator.Estimate) {
	w.Header().Set("X-Tokengate-Count", "estimate")
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		TotalTokens int64 `json:"totalTokens"`
	}{est.InputTokens})
}

// geminiHeaderDrops are request headers never forwarded besides the ones
// every wire drops: the tenant's key in Google's header.
var geminiHeaderDrops = map[string]bool{"X-Goog-Api-Key": true}

// request forwards to the same path and query on the upstream, without
// ?key= (the tenant's), with the client's headers but its credentials,
// and tokengate's key as x-goog-api-key.
func (gemini) request(ctx context.Context, cfg *Config, r *http.Request, body []byte) (*http.Request, error) {
	req, err := newUpstreamRequest(ctx, cfg.GeminiUpstream, r, body)
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	q.Del("key")
	req.URL.RawQuery = q.Encode()
	for k, vs := range r.Header {
		if c := http.CanonicalHeaderKey(k); !upstreamHeaderDrops[c] && !geminiHeaderDrops[c] {
			req.Header[k] = vs
		}
	}
	req.Header.Set("Content-Type", "application/json") // the body tokengate read, whatever the client said
	if cfg.GeminiKey != "" {
		req.Header.Set("X-Goog-Api-Key", cfg.GeminiKey)
	}
	return req, nil
}

// answered relays Google's headers as they are: Gemini sends no rate
// limit headers of its account.
func (gemini) answered(http.Header) {}

// usage reads a whole answer's usage: a GenerateContentResponse's
// usageMetadata (a streamGenerateContent answer is a stream in either
// form: framing), or an embedding answer's, which only Vertex AI states
// (its promptTokenCount; an embedding writes no output): AI Studio's
// states none, and the path settles it at its estimate.
func (gemini) usage(rt route, body []byte) (rule.Usage, bool) {
	var c geminiChunk
	if json.Unmarshal(body, &c) != nil {
		return rule.Usage{}, false
	}
	u, ok := c.UsageMetadata.usage()
	if rt.op == "embeddings" {
		u.Output, u.Reasoning = 0, 0
	}
	return u, ok
}

func (gemini) rateHeaders(h http.Header, snap rule.Snapshot) {
	for _, rh := range snap.RateHeaders() {
		h.Set(rh.Name, rh.Value)
	}
}

func (gemini) exhaustedHeaders(http.Header, *rule.BudgetExhaustedError) {}
