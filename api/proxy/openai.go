package proxy

// OpenAI's wire (`--upstream URL`): the Chat Completions, Responses,
// Completions and Embeddings APIs, with a tenant key as the bearer token.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// openAI is OpenAI's wire: a bearer key, OpenAI's error object and
// x-ratelimit headers, its SSE chunks and usage.
type openAI struct{}

// The OpenAI APIs, by route.api.
const (
	chatCompletions = iota
	responses
	completions
	embeddings // input only: see embeddings.go
)

var openAIRoutes = map[string]route{
	"/v1/chat/completions": {op: "chat", api: chatCompletions},
	"/v1/responses":        {op: "chat", api: responses},
	"/v1/completions":      {op: "text_completion", api: completions},
	"/v1/embeddings":       {op: "embeddings", api: embeddings},
}

func (openAI) route(r *http.Request) (route, bool) {
	rt, ok := openAIRoutes[r.URL.Path]
	return rt, ok
}

func (openAI) upstream(cfg *Config) *url.URL { return cfg.Upstream }

func (openAI) provider() string { return "openai" }

func (openAI) key(r *http.Request) string { return bearer(r) }

func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

func (openAI) parse(rt route, _ *http.Request, body []byte) (*estimator.Request, error) {
	return parse(rt.api, body)
}

// prepare checks the stream options and, for a stream whose client did
// not ask for its usage chunk, asks for it (rt.added): the proxy settles
// from it, and keeps it from the client.
func (openAI) prepare(rt *route, body []byte) ([]byte, error) {
	opts, err := readStreamOptions(body)
	if err != nil {
		return nil, &estimator.InvalidError{Field: "stream_options", Reason: err.Error()}
	}
	if !opts.stream || rt.api == responses || rt.api == embeddings || opts.includeUsage {
		return body, nil
	}
	forward, err := withIncludeUsage(body)
	if err != nil {
		return nil, err
	}
	rt.added = true
	return forward, nil
}

// count is never called: no OpenAI route is a count.
func (openAI) count(_ *Proxy, w http.ResponseWriter, _ *http.Request, _ []byte, _ estimator.Estimate) {
	fail(w, openAI{}, problem{code: codeNotFound})
}

// request passes the client's Accept and sets tokengate's own key.
func (openAI) request(ctx context.Context, cfg *Config, r *http.Request, body []byte) (*http.Request, error) {
	req, err := newUpstreamRequest(ctx, cfg.Upstream, r, body)
	if err != nil {
		return nil, err
	}
	if a := r.Header.Get("Accept"); a != "" {
		req.Header.Set("Accept", a)
	}
	if cfg.UpstreamKey != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.UpstreamKey)
	}
	return req, nil
}

func (openAI) answered(http.Header) {}

// usage reads the usage of a whole (not streamed) answer.
func (openAI) usage(rt route, body []byte) (rule.Usage, bool) {
	if rt.api == embeddings {
		return readEmbeddingsUsage(body)
	}
	var v struct {
		Usage       *wireUsage `json:"usage"`
		ServiceTier string     `json:"service_tier"`
	}
	if json.Unmarshal(body, &v) != nil {
		return rule.Usage{}, false
	}
	u, ok := v.Usage.usage()
	u.Tier = estimator.ReadServiceTier(v.ServiceTier)
	return u, ok
}

// wireUsage reads the usage objects of the three APIs: Chat
// Completions' and Completions' names, and the Responses API's.
type wireUsage struct {
	PromptTokens            *int64         `json:"prompt_tokens"`
	CompletionTokens        *int64         `json:"completion_tokens"`
	InputTokens             *int64         `json:"input_tokens"`
	OutputTokens            *int64         `json:"output_tokens"`
	PromptTokensDetails     *openAIDetails `json:"prompt_tokens_details"`
	InputTokensDetails      *openAIDetails `json:"input_tokens_details"`
	CompletionTokensDetails *openAIDetails `json:"completion_tokens_details"`
	OutputTokensDetails     *openAIDetails `json:"output_tokens_details"`
}

// openAIDetails are the parts of an input (cached) or an output
// (reasoning).
type openAIDetails struct {
	CachedTokens    int64 `json:"cached_tokens"`
	ReasoningTokens int64 `json:"reasoning_tokens"`
}

// usage is w as reported (the path clamps it), false when it states no
// input and output by either API's names.
func (w *wireUsage) usage() (rule.Usage, bool) {
	if w == nil {
		return rule.Usage{}, false
	}
	in, out, inParts, outParts := w.PromptTokens, w.CompletionTokens, w.PromptTokensDetails, w.CompletionTokensDetails
	if in == nil || out == nil {
		in, out, inParts, outParts = w.InputTokens, w.OutputTokens, w.InputTokensDetails, w.OutputTokensDetails
	}
	if in == nil || out == nil {
		return rule.Usage{}, false
	}
	u := rule.Usage{Input: *in, Output: *out}
	if inParts != nil {
		u.CacheRead = inParts.CachedTokens
	}
	if outParts != nil {
		u.Reasoning = outParts.ReasoningTokens
	}
	return u, true
}

// openAIShapes is OpenAI's answer to each problem. An exhausted budget
// window is its own answer to a spent quota, 429 insufficient_quota; a
// request too large for any limit is a 422, as the HTTP API answers it
// (OpenAI's SDKs do not retry a 422 any more than a 400). Every status is
// the code's own (statuses).
var openAIShapes = map[code]shape{
	codeNotFound:    {typ: "not_found", message: "tokengate proxies /v1/chat/completions, /v1/responses, /v1/completions and /v1/embeddings"},
	codeExhausted:   {typ: "insufficient_quota", prefix: "tokengate: "},
	codeRejected:    {typ: "rate_limit_exceeded"},
	codeThrottled:   {typ: "rate_limit_exceeded"},
	codeTooLarge:    {typ: "request_too_large"},
	codeBadKey:      {typ: "invalid_api_key", message: "incorrect tokengate key"},
	codeDisabled:    {typ: "permission_denied"},
	codeEndUserCap:  {typ: "end_user_cap"},
	codeBusy:        {typ: "estimator_busy", prefix: "tokengate: "},
	codeInternal:    {typ: "api_error"},
	codeUnavailable: {typ: "api_error"},
	codeUpstream:    {typ: "api_error"},

	codeModelNotAllowed: {typ: "model_not_allowed", noRetry: true},
}

// shape is c's entry in openAIShapes, else an invalid_request_error.
func (openAI) shape(c code) shape {
	return shapeIn(openAIShapes, c, shape{typ: "invalid_request_error"})
}

// errorBody is OpenAI's error shape, which its SDKs read.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func (openAI) writeError(w http.ResponseWriter, status int, typ, param, message string) {
	var b errorBody
	b.Error.Message, b.Error.Type = message, typ
	if param != "" {
		b.Error.Param = &param
	}
	code := typ
	b.Error.Code = &code
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(b)
}

// rateHeaders sets OpenAI's x-ratelimit headers from a snapshot.
func (openAI) rateHeaders(h http.Header, snap rule.Snapshot) {
	for _, rh := range snap.RateHeaders() {
		h.Set(rh.Name, rh.Value)
	}
}

// exhaustedHeaders adds nothing: the window's x-ratelimit headers are
// every wire's (setExhaustedHeaders).
func (openAI) exhaustedHeaders(http.Header, *rule.BudgetExhaustedError) {}

// streamOptions is what the proxy must know of a request's streaming.
type streamOptions struct{ stream, includeUsage bool }

// readStreamOptions reads stream and stream_options.include_usage by
// their exact names. OpenAI's API reads its JSON keys case-sensitively: a
// "Stream_Options" or "Include_Usage" is no option upstream, so it must be
// none here either (encoding/json's struct fields would match it
// case-insensitively, and the usage chunk the proxy settles from would
// never be asked for).
func readStreamOptions(body []byte) (streamOptions, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		return streamOptions{}, errors.New("must be an object")
	}
	var o streamOptions
	var so map[string]json.RawMessage
	switch {
	case !optional(top["stream"], &o.stream):
		return o, errors.New("stream must be a boolean")
	case !optional(top["stream_options"], &so):
		return o, errors.New("must be an object")
	case !optional(so["include_usage"], &o.includeUsage):
		return o, errors.New("include_usage must be a boolean")
	}
	return o, nil
}

// optional decodes raw into v when it is given and not null, and says
// whether it could.
func optional(raw json.RawMessage, v any) bool {
	return raw == nil || string(raw) == "null" || json.Unmarshal(raw, v) == nil
}

// withIncludeUsage returns body with stream_options.include_usage set.
func withIncludeUsage(body []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	so := map[string]json.RawMessage{}
	if raw, ok := m["stream_options"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &so); err != nil {
			return nil, err
		}
	}
	so["include_usage"] = json.RawMessage("true")
	b, err := json.Marshal(so)
	if err != nil {
		return nil, err
	}
	m["stream_options"] = b
	return json.Marshal(m)
}
