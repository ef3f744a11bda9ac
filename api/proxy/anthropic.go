package proxy

// Anthropic's Messages API (`--anthropic-upstream URL`): Claude Code and
// the Anthropic SDKs point ANTHROPIC_BASE_URL at the proxy and use a tenant
// key as their API key. A call of /v1/messages is admitted on the same
// path as the OpenAI routes, forwarded with tokengate's own Anthropic key,
// and settled from Anthropic's usage: its input, cache reads and cache
// writes priced by the domain at the model's weights.
// /v1/messages/count_tokens is answered from the estimator and never
// debits.

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// anthropic is Anthropic's wire: the tenant's key in x-api-key (or as a
// bearer token), tokengate's x-api-key with the client's other headers
// (anthropic-version, anthropic-beta) upstream, Anthropic's error shape,
// its SSE events and usage, and the upstream's own anthropic-ratelimit-*
// headers (the organisation's) never relayed.
type anthropic struct{}

// The Messages API's routes, by route.api.
const (
	messagesAPI = iota
	countTokensAPI
)

const (
	messagesPath    = "/v1/messages"
	countTokensPath = "/v1/messages/count_tokens"
)

func (anthropic) route(r *http.Request) (route, bool) {
	switch r.URL.Path {
	case messagesPath:
		return route{op: "chat", api: messagesAPI}, true
	case countTokensPath:
		return route{op: "chat", api: countTokensAPI, count: true}, true
	}
	return route{}, false
}

func (anthropic) upstream(cfg *Config) *url.URL { return cfg.AnthropicUpstream }

func (anthropic) provider() string { return "anthropic" }

// key is the tenant's key: x-api-key, as Anthropic's SDKs send it, or a
// bearer token (Claude Code's ANTHROPIC_AUTH_TOKEN).
func (anthropic) key(r *http.Request) string {
	if k := strings.TrimSpace(r.Header.Get("X-Api-Key")); k != "" {
		return k
	}
	return bearer(r)
}

// parse reads a Messages body (or a count_tokens one), at the model's
// widest window when the call carries the 1M-context beta.
func (anthropic) parse(rt route, r *http.Request, body []byte) (*estimator.Request, error) {
	parse := estimator.ParseMessages
	if rt.api == countTokensAPI {
		parse = estimator.ParseCountTokens
	}
	q, err := parse(body)
	return withContext1M(q, r), err
}

// prepare forwards the body as it came: Anthropic's stream always states
// its usage.
func (anthropic) prepare(_ *route, body []byte) ([]byte, error) { return body, nil }

func (anthropic) request(ctx context.Context, cfg *Config, r *http.Request, body []byte) (*http.Request, error) {
	req, err := newUpstreamRequest(ctx, cfg.AnthropicUpstream, r, body)
	if err != nil {
		return nil, err
	}
	anthropicHeaders(cfg, r, req.Header)
	req.Header.Set("Content-Type", "application/json") // the body tokengate read, whatever the client said
	return req, nil
}

// upstreamHeaderDrops are request headers never forwarded: the tenant's
// credentials, hop-by-hop headers, and Accept-Encoding (the client's
// transport negotiates its own, and decodes it, so the proxy reads the
// usage).
var upstreamHeaderDrops = map[string]bool{
	"Authorization": true, "X-Api-Key": true, "Proxy-Authorization": true, "Cookie": true,
	"Content-Length": true, "Connection": true, "Transfer-Encoding": true, "Keep-Alive": true, "Te": true,
	"Trailer": true, "Upgrade": true, "Proxy-Connection": true, "Host": true, "Accept-Encoding": true,
}

// anthropicHeaders passes the client's headers but the dropped ones (its
// key above all) and sets tokengate's own key.
func anthropicHeaders(cfg *Config, from *http.Request, to http.Header) {
	for k, vs := range from.Header {
		if !upstreamHeaderDrops[http.CanonicalHeaderKey(k)] {
			to[k] = vs
		}
	}
	if cfg.AnthropicKey != "" {
		to.Set("X-Api-Key", cfg.AnthropicKey)
	}
}

func (anthropic) answered(h http.Header) { dropUpstreamRateHeaders(h) }

// dropUpstreamRateHeaders removes the upstream's own rate limit headers:
// the organisation's limits are tokengate's business, and the tenant's
// are the ones the caller is held to.
func dropUpstreamRateHeaders(h http.Header) {
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "anthropic-ratelimit-") {
			delete(h, k)
		}
	}
}

// usage reads a whole answer's usage, which must state its input and
// output.
func (anthropic) usage(_ route, body []byte) (rule.Usage, bool) {
	var v struct {
		Usage *anthropicUsage `json:"usage"`
	}
	if json.Unmarshal(body, &v) != nil || !v.Usage.complete() {
		return rule.Usage{}, false
	}
	var u rule.Usage
	mergeAnthropic(&u, v.Usage)
	return u, true
}

// anthropicShapes is Anthropic's answer to each problem: a refusal is a
// 429 rate_limit_error, so that the SDK's own retry waits exactly long
// enough; a request that can never fit is an invalid_request_error, which
// no SDK retries. An exhausted budget window is Anthropic's billing_error
// (402), its one documented error for an account that cannot pay for the
// request: no SDK retries it, which is right for a wait of hours.
var anthropicShapes = map[code]shape{
	codeNotFound:     {typ: "not_found_error", message: "this tokengate proxy serves no Anthropic upstream (--anthropic-upstream)"},
	codeBodyTooLarge: {typ: "request_too_large"},
	codeReplayed:     {typ: "invalid_request_error", bare: true, noRetry: true},
	codeKeyMismatch:  {typ: "invalid_request_error", bare: true, noRetry: true},
	codeExhausted:    {status: http.StatusPaymentRequired, typ: "billing_error", prefix: "tokengate: budget_exhausted: "},
	codeRejected:     {typ: "rate_limit_error"},
	codeThrottled:    {typ: "rate_limit_error"},
	codeTooLarge:     {status: http.StatusBadRequest, typ: "invalid_request_error"},
	codeBadKey:       {typ: "authentication_error", message: "invalid tokengate key"},
	codeDisabled:     {typ: "permission_error"},
	codeEndUserCap:   {typ: "rate_limit_error", prefix: "end_user_cap: ", noRetry: true},
	codeBusy:         {typ: "overloaded_error", prefix: "tokengate estimator_busy: "},
	codeUnavailable:  {status: 529, typ: "overloaded_error"},
	codeInternal:     {typ: "api_error"},
	codeUpstream:     {typ: "api_error"},

	codeModelNotAllowed: {typ: "permission_error", noRetry: true},
}

// shape is c's entry in anthropicShapes, else an invalid_request_error.
func (anthropic) shape(c code) shape {
	return shapeIn(anthropicShapes, c, shape{typ: "invalid_request_error"})
}

// anthropicError is Anthropic's error shape, which its SDKs read.
type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// writeError writes Anthropic's error, whose only words are its message:
// a param leads it.
func (anthropic) writeError(w http.ResponseWriter, status int, typ, param, message string) {
	if param != "" {
		message = param + ": " + message
	}
	b := anthropicError{Type: "error"}
	b.Error.Type, b.Error.Message = typ, message
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(b)
}

// rateHeaders sets Anthropic's anthropic-ratelimit headers from the
// tenant's snapshot: limit, remaining, and the RFC 3339 time the bucket is
// full again.
func (anthropic) rateHeaders(h http.Header, snap rule.Snapshot) {
	h.Set("Anthropic-Ratelimit-Tokens-Limit", strconv.FormatInt(snap.Limits.TokensCapacity, 10))
	h.Set("Anthropic-Ratelimit-Tokens-Remaining", strconv.FormatInt(max(0, snap.Tokens()), 10))
	if !rule.Never(snap.TokensFullIn) { // no time to promise (rule.NeverRefills)
		h.Set("Anthropic-Ratelimit-Tokens-Reset", snap.At.Add(snap.TokensFullIn).UTC().Format(time.RFC3339))
	}
	if snap.Limits.RequestsCapacity > 0 {
		h.Set("Anthropic-Ratelimit-Requests-Limit", strconv.FormatInt(snap.Limits.RequestsCapacity, 10))
		h.Set("Anthropic-Ratelimit-Requests-Remaining", strconv.FormatInt(max(0, snap.Requests()), 10))
		if !rule.Never(snap.RequestsFullIn) {
			h.Set("Anthropic-Ratelimit-Requests-Reset", snap.At.Add(snap.RequestsFullIn).UTC().Format(time.RFC3339))
		}
	}
}

// exhaustedHeaders states a spent token window in Anthropic's token
// headers too: its cap, what is left of it, and its reset.
func (anthropic) exhaustedHeaders(h http.Header, exh *rule.BudgetExhaustedError) {
	if exh.Counts == rule.CountTokens {
		h.Set("Anthropic-Ratelimit-Tokens-Limit", exh.Decimal(exh.Cap))
		h.Set("Anthropic-Ratelimit-Tokens-Remaining", exh.Decimal(exh.Remaining()))
		h.Set("Anthropic-Ratelimit-Tokens-Reset", exh.Resets.UTC().Format(time.RFC3339))
	}
}
