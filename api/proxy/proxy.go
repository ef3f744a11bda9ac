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
// Every wire (OpenAI's, Anthropic's Messages API, Google's Gemini API)
// takes one path (path.go): authenticate, apply the key's rule, estimate,
// reserve, forward, relay, settle or release, count. What differs between wires
// is a dialect (dialect.go): where the key is, how a body is read and
// estimated, how the upstream is called, how an error looks, how usage is
// read from an answer and a stream. Failures are mapped once (errors.go)
// and shaped by the wire. A reported usage is clamped once, at the
// settle (rule.Usage.Clamp).
//
// It is a face: it may import the domain (budget and the packages below
// it, estimator), never another face.
package proxy

import (
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/batch"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/estimator"
)

// Config configures a Proxy's HTTP concerns; its domain services are the
// replica's. Upstream, AnthropicUpstream, GeminiUpstream or several are
// required: each serves its own routes.
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
	// GeminiUpstream is the Gemini API's base URL, e.g.
	// https://generativelanguage.googleapis.com (or a Vertex AI endpoint,
	// https://aiplatform.googleapis.com, whose express mode takes an API
	// key): with it the proxy serves models/{model}:generateContent,
	// :streamGenerateContent and :countTokens, on AI Studio's paths and
	// Vertex AI's.
	GeminiUpstream *url.URL
	// GeminiKey is sent to GeminiUpstream as its x-goog-api-key; the
	// tenant's key never leaves tokengate.
	GeminiKey string
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
	// BatchFileLimit bounds a batch input file (batch.go). Default
	// DefaultBatchFileBytes.
	BatchFileLimit int64
}

// Proxy is the OpenAI-compatible face.
type Proxy struct {
	cfg       Config
	admitter  *admission.Admitter
	guard     *credential.Guard
	estimates *estimator.Gate // the replica's: bounds the bytes estimated at once
	batches   *batch.Service  // the replica's (batch.go)
	logger    *slog.Logger
	tracing   *replica.Tracing // the replica's (nil-safe)
	tracer    trace.Tracer     // nil: tracing is off
	calls     *prometheus.CounterVec
	// wires are the dialects served, in the order they are asked to route
	// a call; the first answers a call none routes.
	wires []dialect
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
	p := &Proxy{wires: []dialect{openAI{}, anthropic{}, gemini{}}, cfg: cfg, admitter: rep.Admitter, guard: rep.Guard, estimates: rep.EstimateGate, batches: rep.Batches, logger: rep.Logger, tracing: rep.Tracing, tracer: tracer,
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokengate_proxy_calls_total",
			Help: "Calls through the OpenAI-compatible proxy by outcome (settled, usage_clamped: settled at the bound of usage the upstream overstated, released, refused, invalid, busy: not estimated in time, upstream_error).",
		}, []string{"outcome"})}
	rep.Registry.MustRegister(p.calls)
	if rep.Batches != nil {
		rep.Registry.MustRegister(newBatchMetrics(rep.Batches))
	}
	return p
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

func peerAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
