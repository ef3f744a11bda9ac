// Package proxy is tokengate's OpenAI-compatible face (`tokengate serve
// --proxy-addr :8082 --upstream URL`): OpenAI SDKs point their base URL at it and use a
// tenant key as their API key. For each call of /v1/chat/completions,
// /v1/responses, /v1/completions or /v1/embeddings it authenticates the
// key, estimates and admits the request, forwards it to the upstream with
// the upstream's own key, and settles from the usage the upstream reports
// (an embedding's input alone: it has no output). A streamed answer
// is relayed event by event; if the stream breaks or the client goes away,
// the request is settled with the tokens streamed so far, counted exactly;
// if the upstream fails before its first byte, the reservation is released.
// No path leaves a reservation open.
//
// It is a face: it may import the domain (budget and the packages below
// it, estimator), never another face.
package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokengate/tokengate/budget"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// kind is which OpenAI API a call is, for reading its usage and stream.
type kind int

const (
	chatCompletions kind = iota
	responses
	completions
	embeddings // input only: see embeddings.go
)

var kinds = map[string]kind{
	"/v1/chat/completions": chatCompletions,
	"/v1/responses":        responses,
	"/v1/completions":      completions,
	"/v1/embeddings":       embeddings,
}

// Config configures a Proxy's HTTP concerns; its domain services are the
// replica's. Upstream, AnthropicUpstream or both are required: each
// serves its own routes.
type Config struct {
	// Upstream is the provider's base URL (the path of each call is
	// appended), e.g. https://api.openai.com.
	Upstream *url.URL
	// UpstreamKey is sent to the upstream as its bearer token; the tenant's
	// key never leaves tokengate.
	UpstreamKey string
	// AnthropicUpstream is Anthropic's base URL, e.g.
	// https://api.anthropic.com: with it the proxy serves the Messages
	// API (/v1/messages and /v1/messages/count_tokens).
	AnthropicUpstream *url.URL
	// AnthropicKey is sent to AnthropicUpstream as its x-api-key; the
	// tenant's key never leaves tokengate.
	AnthropicKey string
	// CountTokensUpstream answers /v1/messages/count_tokens with
	// Anthropic's own count (forwarded with AnthropicKey) instead of the
	// estimator's, falling back to the estimate when the upstream cannot
	// answer. Either way nothing is admitted or debited. Default false:
	// the estimate, which costs no upstream call.
	CountTokensUpstream bool
	// Client calls the upstream. Default: no overall timeout (streams run
	// long), 30 s to connect and to get the response headers.
	Client *http.Client
	// ClientAddr is the address a call comes from, which failed
	// authentications are limited by. Default: the connection's peer;
	// behind a load balancer, pass the API's (api.Server.ClientAddr), which
	// reads X-Forwarded-For from trusted proxies.
	ClientAddr func(*http.Request) string
	// BodyLimit bounds a request body. Default
	// estimator.DefaultMaxRequestBytes.
	BodyLimit int64
}

// Proxy is the OpenAI-compatible face.
type Proxy struct {
	cfg       Config
	admitter  *admission.Admitter
	guard     *credential.Guard
	estimator *estimator.Estimator
	estimates *estimator.Gate // the replica's: bounds the bytes estimated at once
	logger    *slog.Logger
	tracing   *replica.Tracing // the replica's (nil-safe)
	tracer    trace.Tracer     // nil: tracing is off
	calls     *prometheus.CounterVec
}

// New returns a Proxy on the replica's services; its metrics join the
// replica's registry.
func New(rep *replica.Replica, cfg Config) *Proxy {
	if cfg.Client == nil {
		cfg.Client = &http.Client{Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			ResponseHeaderTimeout: 30 * time.Second,
			MaxIdleConnsPerHost:   256,
			IdleConnTimeout:       90 * time.Second,
		}}
	}
	if cfg.BodyLimit <= 0 {
		cfg.BodyLimit = estimator.DefaultMaxRequestBytes
	}
	if cfg.ClientAddr == nil {
		cfg.ClientAddr = peerAddr
	}
	var tracer trace.Tracer
	if tp := rep.Tracing.TracerProvider(); tp != nil {
		tracer = tp.Tracer(TracerName)
	}
	p := &Proxy{cfg: cfg, admitter: rep.Admitter, guard: rep.Guard, estimator: rep.Estimator, estimates: rep.EstimateGate, logger: rep.Logger, tracing: rep.Tracing, tracer: tracer,
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokengate_proxy_calls_total",
			Help: "Calls through the OpenAI-compatible proxy by outcome (settled, usage_clamped: settled at the bound of usage the upstream overstated, released, refused, invalid, busy: not estimated in time, upstream_error).",
		}, []string{"outcome"})}
	rep.Registry.MustRegister(p.calls)
	return p
}

// ServeHTTP serves the OpenAI endpoints of kinds.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r = p.withTrace(r)
	if isMessagesPath(r.URL.Path) {
		p.serveMessages(w, r)
		return
	}
	k, ok := kinds[r.URL.Path]
	switch {
	case !ok || p.cfg.Upstream == nil:
		writeError(w, http.StatusNotFound, "not_found", "", "tokengate proxies /v1/chat/completions, /v1/responses, /v1/completions and /v1/embeddings")
		return
	case r.Method != http.MethodPost:
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "", "use POST")
		return
	}
	ctx := r.Context()
	start := time.Now()
	principal, err := p.guard.TenantDeferred(ctx, p.cfg.ClientAddr(r), bearer(r))
	if err != nil {
		p.calls.WithLabelValues("refused").Inc()
		writeDomainError(w, err)
		return
	}
	idem, bad := idempotencyKey(r)
	if bad != "" {
		p.invalid(start)
		writeError(w, http.StatusBadRequest, "invalid_request_error", "Idempotency-Key", bad)
		return
	}
	release, err := p.gate(r, principal.TenantID)
	if p.notEstimated(err) {
		writeDomainError(w, err)
		return
	}
	defer release()
	body, ok := p.readBody(w, r)
	if !ok {
		return
	}
	req, est, err := p.estimate(body, func(b []byte) (*estimator.Request, error) { return parse(k, b) })
	release()
	var inv *estimator.InvalidError
	if errors.As(err, &inv) {
		p.invalid(start)
		writeError(w, http.StatusBadRequest, "invalid_request_error", inv.Field, inv.Reason)
		return
	}
	if err != nil {
		p.invalid(start)
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "the request could not be read")
		return
	}
	opts, err := readStreamOptions(body)
	if err != nil {
		p.invalid(start)
		writeError(w, http.StatusBadRequest, "invalid_request_error", "stream_options", err.Error())
		return
	}
	forward := body
	stripUsage := false
	if opts.stream && k != responses && k != embeddings && !opts.includeUsage {
		// Ask for the usage chunk to settle from, and keep it from a
		// client that did not ask for it.
		if forward, err = withIncludeUsage(body); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "", "the request could not be read")
			return
		}
		stripUsage = true
	}
	res, _, err := p.admitter.Reserve(ctx, admission.Request{MaxWait: time.Duration(req.MaxWaitMS()) * time.Millisecond,
		Face: admission.FaceProxy, Start: start, Body: body, EndUser: endUserOf(req, r),
		ReserveParams: budget.ReserveParams{TenantID: principal.TenantID, Estimate: est, IdempotencyKey: idem,
			Actor: "proxy:key:" + principal.KeyID, KeyID: principal.KeyID}})
	if err != nil {
		outcome := "refused"
		if inv := (*rule.InvalidError)(nil); errors.As(err, &inv) {
			outcome = "invalid" // counted as an invalid admission by the admission layer
		}
		p.calls.WithLabelValues(outcome).Inc()
		writeDomainError(w, err)
		return
	}
	setRateHeaders(w.Header(), res.Snapshot)
	w.Header().Set("X-Tokengate-Admission", res.AdmissionID)
	if res.Replayed {
		// A retry of a call that was admitted: its answer went to the first
		// caller, and a second upstream call would run (and cost) again.
		writeError(w, http.StatusConflict, "invalid_request_error", "Idempotency-Key",
			"this Idempotency-Key was admitted already (admission "+res.AdmissionID+"); send a new key to call again")
		return
	}
	c := &call{p: p, kind: k, principal: principal, admission: res, est: est, stripUsage: stripUsage}
	c.forward(w, r, forward)
}

// call is one admitted request on its way to the upstream and back.
type call struct {
	p          *Proxy
	kind       kind
	principal  credential.Principal
	admission  *budget.Reservation
	est        estimator.Estimate
	stripUsage bool
	// parent is the caller's span and upstream the upstream call's, while
	// tracing is on (trace.go).
	parent, upstream trace.Span
}

// dialect is what differs between the upstream APIs the proxy relays to:
// where a call goes and with which headers, how a failure is written, how
// a stream is relayed and settled, and how a whole answer's usage is read.
// relay is the rest, once for both.
type dialect struct {
	base     func(*Config) *url.URL
	provider string // gen_ai.provider.name
	headers  func(cfg *Config, from *http.Request, to http.Header)
	fail     func(w http.ResponseWriter, status int, message string)
	stream   func(c *call, w http.ResponseWriter, resp *http.Response)
	answer   func(c *call, out []byte) // settles from a whole answer
	// answered edits the upstream's answer headers before they are relayed
	// (nil: as they are).
	answered func(http.Header)
}

// openAIDialect is OpenAI's wire: a bearer upstream key, OpenAI's error
// object, its SSE chunks and usage.
var openAIDialect = dialect{
	base:     func(cfg *Config) *url.URL { return cfg.Upstream },
	provider: "openai",
	headers: func(cfg *Config, from *http.Request, to http.Header) {
		if a := from.Header.Get("Accept"); a != "" {
			to.Set("Accept", a)
		}
		if cfg.UpstreamKey != "" {
			to.Set("Authorization", "Bearer "+cfg.UpstreamKey)
		}
	},
	fail: func(w http.ResponseWriter, status int, message string) {
		writeError(w, status, "api_error", "", message)
	},
	stream: (*call).stream,
	answer: func(c *call, out []byte) {
		if u, ok := readUsage(c.kind, out); ok {
			c.settle(u)
		} else {
			c.settle(c.estimated()) // no usage reported: the estimate stands
		}
	},
}

func (c *call) forward(w http.ResponseWriter, r *http.Request, body []byte) {
	c.relay(w, r, body, openAIDialect)
}

// relay sends an admitted call upstream and its answer back, and ends its
// reservation on every path: released when nothing reached the model or
// the upstream refused before any output; settled from the usage the
// answer or stream reports, else from the estimate or what was streamed.
func (c *call) relay(w http.ResponseWriter, r *http.Request, body []byte, d dialect) {
	target := d.base(&c.p.cfg).JoinPath(r.URL.Path)
	target.RawQuery = r.URL.RawQuery
	ureq, err := http.NewRequestWithContext(r.Context(), http.MethodPost, target.String(), bytes.NewReader(body))
	if err != nil {
		c.release()
		d.fail(w, http.StatusBadGateway, "the upstream request could not be built")
		return
	}
	d.headers(&c.p.cfg, r, ureq.Header)
	ureq.Header.Set("Content-Type", "application/json")
	c.startUpstream(r, ureq, d.provider)
	defer c.endUpstream()
	resp, err := c.p.cfg.Client.Do(ureq)
	if err != nil {
		c.upstreamAnswered(0, err)
		// Nothing reached the model (or nothing came back before the
		// client left): nothing is charged.
		c.release()
		c.p.calls.WithLabelValues("upstream_error").Inc()
		d.fail(w, http.StatusBadGateway, "the upstream did not answer")
		return
	}
	defer resp.Body.Close()
	c.upstreamAnswered(resp.StatusCode, nil)
	if d.answered != nil {
		d.answered(resp.Header)
	}
	if resp.StatusCode >= 300 {
		// The upstream refused or failed before any output: released, and
		// its answer relayed as it is (the SDKs retry its 429s and 5xxs).
		c.release()
		c.p.calls.WithLabelValues("upstream_error").Inc()
		copyHeaders(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, io.LimitReader(resp.Body, 1<<20))
		return
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		d.stream(c, w, resp)
		return
	}
	out, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		// The answer broke off: no usage to settle from, and the model ran.
		c.settle(c.estimated())
		d.fail(w, http.StatusBadGateway, "the upstream's answer broke off")
		return
	}
	d.answer(c, out)
	copyHeaders(w.Header(), resp.Header)
	w.Header().Del("Content-Length")
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(out)
}

// settle reconciles the admission with what the call used, whatever
// happened to the client meanwhile.
//
// The upstream's usage is a fact, not a claim: the request already ran. But
// usage beyond what the request could produce (more output than it
// reserved, more than the model's context window: budget.UsageBounds) is
// an upstream's error, and would charge the tenant without bound: it is
// clamped to the bound, logged, and counted as outcome usage_clamped.
func (c *call) settle(u usage) {
	c.settleCache(u.input, u.output, u.reasoning, estimator.CacheUsage{Read: u.cached})
}

// estimated is the usage of a call that reported none: its estimate.
func (c *call) estimated() usage {
	return usage{input: c.est.InputTokens, output: c.est.OutputTokens}
}

// endTimeout bounds a call's settle or release.
const endTimeout = 10 * time.Second

func (c *call) release() {
	ctx, cancel := c.endCtx()
	defer cancel()
	if _, _, err := c.p.admitter.Release(ctx, admission.FaceProxy, budget.ReleaseParams{TenantID: c.tenantID(),
		AdmissionID: c.admission.AdmissionID, Actor: "proxy:key:" + c.principal.KeyID}); err != nil {
		c.p.logger.Error("proxy release failed; the reservation will expire", "admission", c.admission.AdmissionID, "error", err.Error())
		return
	}
	c.p.calls.WithLabelValues("released").Inc()
}

func copyHeaders(dst, src http.Header) {
	for k, vs := range src {
		switch http.CanonicalHeaderKey(k) {
		case "Content-Length", "Connection", "Transfer-Encoding", "Keep-Alive":
			continue
		}
		for _, v := range vs {
			dst.Add(k, v)
		}
	}
}

func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

func peerAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

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

// errorBody is OpenAI's error shape, which its SDKs read.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, typ, param, message string) {
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

// writeDomainError answers a refusal of the domain in OpenAI's terms: a
// 429 with retry-after and retry-after-ms (the SDKs' own retry honours
// them) and the x-ratelimit headers. An exhausted budget window is
// OpenAI's own answer to a spent quota, 429 insufficient_quota, with the
// headers of the window that bound and x-should-retry: false (a wait of
// hours is no retry); a refill that can never make room says so, with no
// retry-after at all.
func writeDomainError(w http.ResponseWriter, err error) {
	var exh *rule.BudgetExhaustedError
	var rej *rule.RejectedError
	var tl *rule.TooLargeError
	var thr *credential.ThrottledError
	var inv *rule.InvalidError
	var other *rule.OtherFaceError
	switch {
	case errors.As(err, &inv):
		writeError(w, http.StatusBadRequest, "invalid_request_error", inv.Field, inv.Reason)
	case errors.As(err, &other):
		// As the HTTP API answers it (409): the proxy ends only what it
		// admitted, so no proxy call meets it today.
		writeError(w, http.StatusConflict, "invalid_request_error", "",
			"admission "+other.AdmissionID+" was made through the "+string(other.Face)+" face; only that face may end it")
	case errors.As(err, &exh):
		setExhaustedHeaders(w.Header(), exh)
		writeError(w, http.StatusTooManyRequests, "insufficient_quota", "", "tokengate: "+exhaustedMessage(exh))
	case errors.As(err, &rej) && rej.Never():
		setRateHeaders(w.Header(), rej.Snapshot)
		w.Header().Set("X-Should-Retry", "false")
		writeError(w, http.StatusTooManyRequests, "rate_limit_exceeded", "",
			"tokengate: rejected by the tenant's "+rej.Named()+" limit, which refills too slowly ever to make room for this request; only a release of open reservations or a change of the limits can")
	case errors.As(err, &rej):
		setRateHeaders(w.Header(), rej.Snapshot)
		ms := rule.RetryAfterMillis(rej.RetryAfter)
		w.Header().Set("Retry-After", strconv.FormatInt(rule.RetryAfterSeconds(rej.RetryAfter), 10))
		w.Header().Set("Retry-After-Ms", strconv.FormatInt(ms, 10))
		writeError(w, http.StatusTooManyRequests, "rate_limit_exceeded", "",
			"tokengate: rejected by the tenant's "+rej.Named()+" limit; retry after "+strconv.FormatInt(ms, 10)+" ms")
	case errors.As(err, &thr):
		w.Header().Set("Retry-After", strconv.FormatInt(rule.RetryAfterSeconds(thr.RetryAfter), 10))
		writeError(w, http.StatusTooManyRequests, "rate_limit_exceeded", "", "too many failed authentications from this address")
	case errors.As(err, &tl):
		// 422, as the HTTP API answers it: the request is well formed but
		// can never fit the tenant's limits (OpenAI's SDKs do not retry
		// a 422 any more than a 400).
		writeError(w, http.StatusUnprocessableEntity, "request_too_large", "", tl.Error())
	case budget.IsInvalidInput(err):
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "a text value of the request cannot be stored (a NUL character, a character outside UTF-8, or too long)")
	case errors.Is(err, credential.ErrKeyInvalid), errors.Is(err, rule.ErrKeyRevoked):
		writeError(w, http.StatusUnauthorized, "invalid_api_key", "", "incorrect tokengate key")
	case errors.Is(err, credential.ErrTenantDisabled), errors.Is(err, rule.ErrTenantDisabled):
		writeError(w, http.StatusForbidden, "permission_denied", "", "the tenant is disabled")
	case errors.Is(err, budget.ErrEndUserCap):
		writeError(w, http.StatusTooManyRequests, "end_user_cap", "", "the tenant has as many end users as its end-user policy allows (max_end_users); a new end user is admitted once an idle one expires")
	case errors.Is(err, rule.ErrIdempotencyMismatch):
		writeError(w, http.StatusConflict, "invalid_request_error", "Idempotency-Key", "this Idempotency-Key was used for another request")
	case errors.Is(err, estimator.ErrBusy):
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Retry-After-Ms", "1000")
		writeError(w, http.StatusServiceUnavailable, "estimator_busy", "", "tokengate: "+err.Error()+" (or this tenant's share of them), and this request's turn did not come in time; retry shortly")
	case errors.Is(err, rule.ErrUnavailable), errors.Is(err, rule.ErrBusy):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "api_error", "", "tokengate cannot decide now: "+err.Error())
	default:
		writeError(w, http.StatusInternalServerError, "api_error", "", "internal error")
	}
}

// setRateHeaders sets OpenAI's x-ratelimit headers from a snapshot.
func setRateHeaders(h http.Header, snap rule.Snapshot) {
	for _, rh := range snap.RateHeaders() {
		h.Set(rh.Name, rh.Value)
	}
}

// invalid counts a call refused as invalid before it could be decided: in
// the proxy's calls and, like every face's, in the admissions.
func (p *Proxy) invalid(start time.Time) {
	p.calls.WithLabelValues("invalid").Inc()
	p.admitter.Invalid(admission.FaceProxy, start)
}
