package proxy

import (
	"context"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The upstream call's span follows the OpenTelemetry GenAI semantic
// conventions: a client span named "{operation} {model}", with the
// operation, the provider, the requested model and the usage the call was
// settled with (the upstream's report, or the estimate when it reported
// none).
const (
	attrOperation    = attribute.Key("gen_ai.operation.name")
	attrProvider     = attribute.Key("gen_ai.provider.name")
	attrRequestModel = attribute.Key("gen_ai.request.model")
	attrInputTokens  = attribute.Key("gen_ai.usage.input_tokens")
	attrOutputTokens = attribute.Key("gen_ai.usage.output_tokens")
	attrServerAddr   = attribute.Key("server.address")
	attrServerPort   = attribute.Key("server.port")
	attrHTTPStatus   = attribute.Key("http.response.status_code")
	attrAdmissionID  = attribute.Key("tokengate.admission_id")

	// TracerName is the instrumentation scope of the proxy's spans.
	TracerName = "github.com/tokengate/tokengate/api/proxy"
)

// withTrace is r with its caller's trace context in its context, while
// tracing is on.
func (p *Proxy) withTrace(r *http.Request) *http.Request {
	if p.tracer == nil {
		return r
	}
	return r.WithContext(p.tracing.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
}

// startUpstream starts the upstream call's client span and puts its trace
// context on the upstream request (traceparent), so the provider's spans
// are its children. Off, the caller's own traceparent and tracestate are
// passed on as they came: the trace goes on past tokengate either way.
func (c *call) startUpstream(r, ureq *http.Request, provider string) {
	if c.p.tracer == nil {
		for _, h := range []string{"Traceparent", "Tracestate"} {
			if v := r.Header.Get(h); v != "" {
				ureq.Header.Set(h, v)
			}
		}
		return
	}
	c.parent = trace.SpanFromContext(r.Context())
	op := c.rt.op
	ctx, span := c.p.tracer.Start(r.Context(), op+" "+c.est.Model, trace.WithSpanKind(trace.SpanKindClient))
	c.upstream = span
	if span.IsRecording() {
		port, _ := strconv.Atoi(ureq.URL.Port())
		if port == 0 {
			port = 80
			if ureq.URL.Scheme == "https" {
				port = 443
			}
		}
		span.SetAttributes(attrOperation.String(op), attrProvider.String(provider), attrRequestModel.String(c.est.Model),
			attrServerAddr.String(ureq.URL.Hostname()), attrServerPort.Int(port), attrAdmissionID.String(c.admission.AdmissionID))
	}
	c.p.tracing.Inject(ctx, propagation.HeaderCarrier(ureq.Header))
}

// upstreamAnswered records the upstream's status on the span.
func (c *call) upstreamAnswered(status int, err error) {
	if c.upstream == nil || !c.upstream.IsRecording() {
		return
	}
	if err != nil {
		c.upstream.SetStatus(codes.Error, err.Error())
		return
	}
	c.upstream.SetAttributes(attrHTTPStatus.Int(status))
	if status >= 400 {
		c.upstream.SetStatus(codes.Error, http.StatusText(status))
	}
}

// upstreamUsage records the usage the call is settled with.
func (c *call) upstreamUsage(in, out int64) {
	if c.upstream != nil && c.upstream.IsRecording() {
		c.upstream.SetAttributes(attrInputTokens.Int64(in), attrOutputTokens.Int64(out))
	}
}

func (c *call) endUpstream() {
	if c.upstream != nil {
		c.upstream.End()
	}
}

// endCtx is the context of the call's settle or release: it outlives the
// client (the accounting must finish), and it is in the caller's trace, so
// the settle's span is a child of the caller's span.
func (c *call) endCtx() (context.Context, context.CancelFunc) {
	ctx := context.Background()
	if c.parent != nil {
		ctx = trace.ContextWithSpan(ctx, c.parent)
	}
	return context.WithTimeout(ctx, endTimeout)
}
