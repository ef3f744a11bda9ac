package proxy

// Anthropic's Messages API (`--anthropic-upstream URL`): Claude Code and
// the Anthropic SDKs point ANTHROPIC_BASE_URL at the proxy and use a tenant
// key as their API key. A call of /v1/messages is admitted through the
// same admission layer as the OpenAI routes, forwarded with tokengate's own
// Anthropic key, and settled from Anthropic's usage: its input, cache reads
// and cache writes priced by the domain at the model's weights.
// /v1/messages/count_tokens is answered from the estimator and never
// debits.

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tokengate/tokengate/budget"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// messages is the kind of an Anthropic Messages call.
const messagesAPI kind = 100

const (
	messagesPath    = "/v1/messages"
	countTokensPath = "/v1/messages/count_tokens"
)

func isMessagesPath(path string) bool { return path == messagesPath || path == countTokensPath }

// serveMessages serves the Messages API and its count_tokens.
func (p *Proxy) serveMessages(w http.ResponseWriter, r *http.Request) {
	switch {
	case p.cfg.AnthropicUpstream == nil:
		writeAnthropicError(w, http.StatusNotFound, "not_found_error", "this tokengate proxy serves no Anthropic upstream (--anthropic-upstream)")
		return
	case r.Method != http.MethodPost:
		writeAnthropicError(w, http.StatusMethodNotAllowed, "invalid_request_error", "use POST")
		return
	}
	ctx := r.Context()
	start := time.Now()
	principal, err := p.guard.TenantDeferred(ctx, p.cfg.ClientAddr(r), anthropicKey(r))
	if err != nil {
		p.calls.WithLabelValues("refused").Inc()
		writeAnthropicDomainError(w, err)
		return
	}
	release, err := p.gate(r, principal.TenantID)
	if p.notEstimated(err) {
		writeAnthropicDomainError(w, err)
		return
	}
	defer release()
	body, ok := p.readMessagesBody(w, r)
	if !ok {
		return
	}
	if r.URL.Path == countTokensPath {
		p.countTokens(w, r, body, release)
		return
	}
	idem, bad := idempotencyKey(r)
	if bad != "" {
		p.invalid(start)
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", "Idempotency-Key: "+bad)
		return
	}
	req, est, err := p.estimate(body, func(b []byte) (*estimator.Request, error) {
		q, err := estimator.ParseMessages(b)
		return withContext1M(q, r), err
	})
	release()
	if err != nil {
		p.invalid(start)
		writeEstimateError(w, err)
		return
	}
	res, _, err := p.admitter.Reserve(ctx, admission.Request{Face: admission.FaceProxy, Start: start, Body: body, EndUser: endUserOf(req, r),
		ReserveParams: budget.ReserveParams{TenantID: principal.TenantID, Estimate: est, IdempotencyKey: idem,
			Actor: "proxy:key:" + principal.KeyID, KeyID: principal.KeyID}})
	if err != nil {
		outcome := "refused"
		if inv := (*rule.InvalidError)(nil); errors.As(err, &inv) {
			outcome = "invalid" // counted as an invalid admission by the admission layer
		}
		p.calls.WithLabelValues(outcome).Inc()
		writeAnthropicDomainError(w, err)
		return
	}
	setAnthropicRateHeaders(w.Header(), res.Snapshot)
	w.Header().Set("X-Tokengate-Admission", res.AdmissionID)
	if res.Replayed {
		// A retry of a call that was admitted: its answer went to the first
		// caller, and a second upstream call would run (and cost) again.
		w.Header().Set("X-Should-Retry", "false")
		writeAnthropicError(w, http.StatusConflict, "invalid_request_error",
			"this Idempotency-Key was admitted already (admission "+res.AdmissionID+"); send a new key to call again")
		return
	}
	c := &call{p: p, kind: messagesAPI, principal: principal, admission: res, est: est}
	c.forwardMessages(w, r, body)
}

// countTokens answers count_tokens with the estimate's input, as
// Anthropic's {"input_tokens": N}, or with the upstream's own count when
// Config.CountTokensUpstream says so. The body is checked here either way:
// a call the estimator refuses never reaches the upstream. Nothing is
// admitted or debited. X-Tokengate-Count says which count answered.
// release gives the body's bytes of the estimate gate back, once it is
// estimated.
func (p *Proxy) countTokens(w http.ResponseWriter, r *http.Request, body []byte, release func()) {
	_, est, err := p.estimate(body, func(b []byte) (*estimator.Request, error) {
		q, err := estimator.ParseCountTokens(b)
		return withContext1M(q, r), err
	})
	release()
	if err != nil {
		p.calls.WithLabelValues("invalid").Inc()
		writeEstimateError(w, err)
		return
	}
	if p.cfg.CountTokensUpstream && p.countTokensUpstream(w, r, body) {
		return
	}
	w.Header().Set("X-Tokengate-Count", "estimate")
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		InputTokens int64 `json:"input_tokens"`
	}{est.InputTokens})
}

// countTokensUpstream forwards a count_tokens call to Anthropic, with the
// headers a Messages call passes and tokengate's key, and relays its
// answer. It answers false, having written nothing, when the upstream
// cannot answer (no connection, a 5xx, a 429): Claude Code counts tokens
// to decide when to compact, and an estimate serves it better than an
// error. A 4xx other than 429 is the call's own fault and is relayed.
func (p *Proxy) countTokensUpstream(w http.ResponseWriter, r *http.Request, body []byte) bool {
	target := p.cfg.AnthropicUpstream.JoinPath(countTokensPath)
	target.RawQuery = r.URL.RawQuery
	ureq, err := http.NewRequestWithContext(r.Context(), http.MethodPost, target.String(), bytes.NewReader(body))
	if err != nil {
		return false
	}
	anthropicHeaders(&p.cfg, r, ureq.Header)
	ureq.Header.Set("Content-Type", "application/json")
	resp, err := p.cfg.Client.Do(ureq)
	if err != nil {
		p.logger.Warn("count_tokens upstream did not answer: answered with the estimate", "error", err.Error())
		return false
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
		p.logger.Warn("count_tokens upstream failed: answered with the estimate", "status", resp.StatusCode)
		return false
	}
	dropUpstreamRateHeaders(resp.Header)
	copyHeaders(w.Header(), resp.Header)
	w.Header().Del("Content-Length")
	w.Header().Set("X-Tokengate-Count", "upstream")
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(out)
	return true
}

func writeEstimateError(w http.ResponseWriter, err error) {
	var inv *estimator.InvalidError
	if errors.As(err, &inv) {
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", inv.Field+": "+inv.Reason)
		return
	}
	writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", "the request could not be read")
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

// anthropicDialect is Anthropic's wire: tokengate's x-api-key with the
// client's other headers (anthropic-version, anthropic-beta), Anthropic's
// error shape, its SSE events and usage, and the upstream's own
// anthropic-ratelimit-* headers (the organisation's) never relayed.
var anthropicDialect = dialect{
	base:     func(cfg *Config) *url.URL { return cfg.AnthropicUpstream },
	provider: "anthropic",
	headers:  anthropicHeaders,
	fail: func(w http.ResponseWriter, status int, message string) {
		writeAnthropicError(w, status, "api_error", message)
	},
	stream: (*call).streamMessages,
	answer: func(c *call, out []byte) {
		var v struct {
			Usage *anthropicUsage `json:"usage"`
		}
		if json.Unmarshal(out, &v) == nil && v.Usage != nil && v.Usage.complete() {
			c.settleMessages(v.Usage.messagesUsage())
		} else {
			c.settle(c.estimated()) // no usage reported: the estimate stands
		}
	},
	answered: dropUpstreamRateHeaders,
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

func (c *call) forwardMessages(w http.ResponseWriter, r *http.Request, body []byte) {
	c.relay(w, r, body, anthropicDialect)
}

// anthropicUsage is Anthropic's usage object, in a whole answer, in
// message_start's message and in message_delta (where each field given is
// the total so far: merge).
type anthropicUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
	CacheCreation            *struct {
		Ephemeral5m *int64 `json:"ephemeral_5m_input_tokens"`
		Ephemeral1h *int64 `json:"ephemeral_1h_input_tokens"`
	} `json:"cache_creation"`
}

// complete says whether u states both input and output.
func (u *anthropicUsage) complete() bool {
	return u != nil && u.InputTokens != nil && u.OutputTokens != nil
}

// messagesUsage is a call's usage in tokengate's terms: input is every
// input token (uncached, read from the cache and written to it), and
// cache says how many touched the cache.
type messagesUsage struct {
	input, output int64
	cache         estimator.CacheUsage
}

// tokenCount reads one usage field: absent, negative or past any call's
// size counts as 0 (the settle's bounds judge the total).
func tokenCount(p *int64) int64 {
	if p == nil || *p < 0 || *p > 1_000_000_000 {
		return 0
	}
	return *p
}

// messagesUsage adds Anthropic's separate input counts into one input:
// Anthropic's input_tokens excludes the cache's reads and writes. The
// writes are split by lifetime when the usage says so.
func (u *anthropicUsage) messagesUsage() messagesUsage {
	var m messagesUsage
	m.merge(u)
	return m
}

// merge applies the fields u gives over m's (a stream's message_delta
// over its message_start). Anthropic's counts are cumulative: each one
// message_delta states is the total so far, never less than message_start
// said. So a field takes the larger of what is known and what u says: a
// zero or an absent field (a message_delta with input_tokens 0, as some
// relays write it) never erases a known count, and a later, larger total
// replaces an earlier one. The cache's writes are one total; their split
// by lifetime is u's when it states one for a total at least as large,
// else the 1 hour part known so far, the rest at 5 minutes.
func (m *messagesUsage) merge(u *anthropicUsage) {
	if u == nil {
		return
	}
	uncached := m.input - m.cache.Read - m.cache.Write5m - m.cache.Write1h
	if u.InputTokens != nil {
		uncached = max(uncached, tokenCount(u.InputTokens))
	}
	if u.OutputTokens != nil {
		m.output = max(m.output, tokenCount(u.OutputTokens))
	}
	if u.CacheReadInputTokens != nil {
		m.cache.Read = max(m.cache.Read, tokenCount(u.CacheReadInputTokens))
	}
	if u.CacheCreationInputTokens != nil {
		if written := tokenCount(u.CacheCreationInputTokens); written >= m.cache.Write5m+m.cache.Write1h {
			m.cache.Write1h = min(m.cache.Write1h, written)
			if cc := u.CacheCreation; cc != nil && cc.Ephemeral1h != nil {
				m.cache.Write1h = min(tokenCount(cc.Ephemeral1h), written)
			}
			m.cache.Write5m = written - m.cache.Write1h
		}
	}
	m.input = uncached + m.cache.Read + m.cache.Write5m + m.cache.Write1h
}

func (c *call) settleMessages(u messagesUsage) {
	c.settleCache(u.input, u.output, 0, u.cache) // Anthropic's usage does not split out thinking
}

// settleCache reconciles the admission with what the call used, whatever
// happened to the client meanwhile: in input tokens, of which cache
// touched the provider's prompt cache, and out output tokens, of which
// reasoning were spent reasoning.
//
// The upstream's usage is a fact, not a claim: the request already ran. But
// usage beyond what the request could produce (more output than it
// reserved, more than the model's context window: budget.UsageBounds) is
// an upstream's error, and would charge the tenant without bound: it is
// clamped to the bound, logged, and counted as outcome usage_clamped.
func (c *call) settleCache(in, out, reasoning int64, cache estimator.CacheUsage) {
	table := c.p.estimator.Table()
	cin, cout, clamped := budget.ClampUsage(c.est, table, in, out)
	// The cache's tokens are priced by the domain, at the model's cache
	// weights, in the settle's own transaction; none may exceed what is
	// left of the (clamped) input.
	left := cin
	take := func(n int64) int64 {
		n = min(max(n, 0), left)
		left -= n
		return n
	}
	read, w5, w1 := take(cache.Read), take(cache.Write5m), take(cache.Write1h)
	// Reasoning is part of the (clamped) output, likewise.
	reasoning = min(max(reasoning, 0), cout)
	if clamped {
		maxOut, maxTotal := budget.UsageBounds(c.est, table)
		c.p.logger.Warn("proxy: the upstream reported usage no request could produce; clamped to the bound",
			"admission", c.admission.AdmissionID, "model", c.est.Model, "input_tokens", in, "output_tokens", out,
			"max_output_tokens", maxOut, "max_total_tokens", maxTotal, "settled_input", cin, "settled_output", cout)
	}
	c.upstreamUsage(in, out)
	ctx, cancel := c.endCtx()
	defer cancel()
	_, _, err := c.p.admitter.Settle(ctx, admission.FaceProxy, budget.SettleParams{TenantID: c.tenantID(), AdmissionID: c.admission.AdmissionID,
		InputTokens: cin, OutputTokens: cout, CachedInputTokens: read, CacheWriteTokens: w5, CacheWrite1hTokens: w1, ReasoningTokens: reasoning,
		Actor: "proxy:key:" + c.principal.KeyID})
	if err != nil {
		// It stays reserved and expires at its TTL, charged at its estimate.
		c.p.logger.Error("proxy settle failed; the reservation will expire", "admission", c.admission.AdmissionID, "error", err.Error())
		return
	}
	if clamped {
		c.p.calls.WithLabelValues("usage_clamped").Inc()
		return
	}
	c.p.calls.WithLabelValues("settled").Inc()
}

// anthropicKey is the tenant's key: x-api-key, as Anthropic's SDKs send
// it, or a bearer token (Claude Code's ANTHROPIC_AUTH_TOKEN).
func anthropicKey(r *http.Request) string {
	if k := strings.TrimSpace(r.Header.Get("X-Api-Key")); k != "" {
		return k
	}
	return bearer(r)
}

// readMessagesBody is readBody with Anthropic's errors.
func (p *Proxy) readMessagesBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, p.cfg.BodyLimit))
	if err == nil {
		return body, true
	}
	p.calls.WithLabelValues("invalid").Inc()
	var mb *http.MaxBytesError
	switch {
	case errors.As(err, &mb):
		writeAnthropicError(w, http.StatusRequestEntityTooLarge, "request_too_large", "the request body is larger than the proxy accepts")
	case errors.Is(err, os.ErrDeadlineExceeded):
		w.Header().Set("Connection", "close")
		writeAnthropicError(w, http.StatusRequestTimeout, "invalid_request_error", "the request body did not arrive within the proxy's body read timeout")
	default:
		w.Header().Set("Connection", "close")
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", "the request body could not be read")
	}
	return nil, false
}

// anthropicError is Anthropic's error shape, which its SDKs read.
type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeAnthropicError(w http.ResponseWriter, status int, typ, message string) {
	b := anthropicError{Type: "error"}
	b.Error.Type, b.Error.Message = typ, message
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(b)
}

// writeAnthropicDomainError answers a refusal of the domain in Anthropic's
// terms: a 429 rate_limit_error with retry-after (and retry-after-ms,
// which the SDKs prefer) and the anthropic-ratelimit headers, so that the
// SDK's own retry waits exactly long enough; a request that can never fit
// is an invalid_request_error, which no SDK retries.
//
// An exhausted budget window is Anthropic's billing_error (402), its one
// documented error for an account that cannot pay for the request: no SDK
// retries it, which is right for a wait of hours, and it names the window,
// what it spent, its cap and its reset, with the window's headers in
// place of the bucket's. A refill that can never make room says so, with
// no retry-after at all.
func writeAnthropicDomainError(w http.ResponseWriter, err error) {
	var exh *rule.BudgetExhaustedError
	var rej *rule.RejectedError
	var tl *rule.TooLargeError
	var thr *credential.ThrottledError
	var inv *rule.InvalidError
	switch {
	case errors.As(err, &inv):
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", inv.Field+": "+inv.Reason)
	case errors.As(err, &exh):
		setExhaustedHeaders(w.Header(), exh)
		if exh.Counts == rule.CountTokens {
			h := w.Header()
			h.Set("Anthropic-Ratelimit-Tokens-Limit", exh.Decimal(exh.Cap))
			h.Set("Anthropic-Ratelimit-Tokens-Remaining", exh.Decimal(exh.Remaining()))
			h.Set("Anthropic-Ratelimit-Tokens-Reset", exh.Resets.UTC().Format(time.RFC3339))
		}
		writeAnthropicError(w, http.StatusPaymentRequired, "billing_error", "tokengate: budget_exhausted: "+exhaustedMessage(exh))
	case errors.As(err, &rej) && rej.Never():
		setAnthropicRateHeaders(w.Header(), rej.Snapshot)
		w.Header().Set("X-Should-Retry", "false")
		writeAnthropicError(w, http.StatusTooManyRequests, "rate_limit_error",
			"tokengate: rejected by the tenant's "+rej.Named()+" limit, which refills too slowly ever to make room for this request; only a release of open reservations or a change of the limits can")
	case errors.As(err, &rej):
		setAnthropicRateHeaders(w.Header(), rej.Snapshot)
		ms := rule.RetryAfterMillis(rej.RetryAfter)
		w.Header().Set("Retry-After", strconv.FormatInt(rule.RetryAfterSeconds(rej.RetryAfter), 10))
		w.Header().Set("Retry-After-Ms", strconv.FormatInt(ms, 10))
		writeAnthropicError(w, http.StatusTooManyRequests, "rate_limit_error",
			"tokengate: rejected by the tenant's "+rej.Named()+" limit; retry after "+strconv.FormatInt(ms, 10)+" ms")
	case errors.As(err, &thr):
		w.Header().Set("Retry-After", strconv.FormatInt(rule.RetryAfterSeconds(thr.RetryAfter), 10))
		writeAnthropicError(w, http.StatusTooManyRequests, "rate_limit_error", "too many failed authentications from this address")
	case errors.As(err, &tl):
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", tl.Error())
	case budget.IsInvalidInput(err):
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", "a text value of the request cannot be stored (a NUL character, a character outside UTF-8, or too long)")
	case errors.Is(err, credential.ErrKeyInvalid), errors.Is(err, rule.ErrKeyRevoked):
		writeAnthropicError(w, http.StatusUnauthorized, "authentication_error", "invalid tokengate key")
	case errors.Is(err, credential.ErrTenantDisabled), errors.Is(err, rule.ErrTenantDisabled):
		writeAnthropicError(w, http.StatusForbidden, "permission_error", "the tenant is disabled")
	case errors.Is(err, budget.ErrEndUserCap):
		w.Header().Set("X-Should-Retry", "false")
		writeAnthropicError(w, http.StatusTooManyRequests, "rate_limit_error", "end_user_cap: "+"the tenant has as many end users as its end-user policy allows (max_end_users); a new end user is admitted once an idle one expires")
	case errors.Is(err, rule.ErrIdempotencyMismatch):
		w.Header().Set("X-Should-Retry", "false")
		writeAnthropicError(w, http.StatusConflict, "invalid_request_error", "this Idempotency-Key was used for another request")
	case errors.Is(err, estimator.ErrBusy):
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Retry-After-Ms", "1000")
		writeAnthropicError(w, http.StatusServiceUnavailable, "overloaded_error", "tokengate estimator_busy: "+err.Error()+" (or this tenant's share of them), and this request's turn did not come in time; retry shortly")
	case errors.Is(err, rule.ErrUnavailable), errors.Is(err, rule.ErrBusy):
		w.Header().Set("Retry-After", "1")
		writeAnthropicError(w, 529, "overloaded_error", "tokengate cannot decide now: "+err.Error())
	default:
		writeAnthropicError(w, http.StatusInternalServerError, "api_error", "internal error")
	}
}

// setAnthropicRateHeaders sets Anthropic's anthropic-ratelimit headers
// from the tenant's snapshot: limit, remaining, and the RFC 3339 time the
// bucket is full again.
func setAnthropicRateHeaders(h http.Header, snap rule.Snapshot) {
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
