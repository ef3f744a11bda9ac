package replica

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Tracing is a replica's OpenTelemetry tracing, configured only by the
// standard OTEL_ variables (TracingFromEnv). A nil *Tracing, like one built
// with the variables unset, is off: it starts no span, exports nothing, and
// its methods cost a nil check, so that a replica without a collector pays
// nothing for the faces' and the admission layer's spans.
type Tracing struct {
	provider   *sdktrace.TracerProvider // nil: off
	propagator propagation.TextMapPropagator
}

// The names of the standard variables TracingFromEnv reads itself; the
// exporters read the rest of OTEL_EXPORTER_OTLP_* (headers, timeout,
// certificates, compression, insecure), the SDK the span limits
// (OTEL_SPAN_*) and the batch processor (OTEL_BSP_*), and the resource
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
const (
	envSDKDisabled     = "OTEL_SDK_DISABLED"
	envTracesExporter  = "OTEL_TRACES_EXPORTER"
	envEndpoint        = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envTracesEndpoint  = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envProtocol        = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envTracesProtocol  = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	envSampler         = "OTEL_TRACES_SAMPLER"
	envSamplerArg      = "OTEL_TRACES_SAMPLER_ARG"
	envPropagators     = "OTEL_PROPAGATORS"
	defaultServiceName = "tokengate"
)

// TracingFromEnv builds the replica's tracing from the standard variables.
// Tracing is on when an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT
// or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or OTEL_TRACES_EXPORTER=otlp asks
// for the default one, and off (nil, nil) otherwise, or with
// OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none: an operator who set
// nothing gets no exporter trying to reach a collector that is not there.
//
// OTEL_EXPORTER_OTLP_PROTOCOL (or its _TRACES_ variant) picks grpc or
// http/protobuf (the default, as the specification says). OTEL_TRACES_SAMPLER
// and OTEL_TRACES_SAMPLER_ARG pick the sampler, as the SDK reads them
// (default parentbased_always_on); a value the SDK would ignore with a
// warning is an error here, so that a typo does not trace everything.
func TracingFromEnv(ctx context.Context) (*Tracing, error) {
	if v := strings.TrimSpace(os.Getenv(envSDKDisabled)); v != "" {
		// A value that is not a boolean ("yes") would leave tracing on.
		off, err := strconv.ParseBool(v)
		if err != nil {
			return nil, envError(envSDKDisabled, v, "use true or false")
		}
		if off {
			return nil, nil
		}
	}
	exporter := strings.ToLower(strings.TrimSpace(os.Getenv(envTracesExporter)))
	switch exporter {
	case "none":
		return nil, nil
	case "", "otlp":
	default:
		return nil, fmt.Errorf("%s=%s: tokengate exports traces by OTLP only (otlp or none)", envTracesExporter, exporter)
	}
	if exporter == "" && os.Getenv(envEndpoint) == "" && os.Getenv(envTracesEndpoint) == "" {
		return nil, nil
	}
	if err := checkTracingEnv(); err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	sampler, err := samplerFromEnv()
	if err != nil {
		return nil, err
	}
	prop, err := propagatorFromEnv()
	if err != nil {
		return nil, err
	}
	// Both protocol variables are checked (checkTracingEnv); the
	// _TRACES_ one wins.
	protocol := strings.TrimSpace(os.Getenv(envTracesProtocol))
	if protocol == "" {
		protocol = strings.TrimSpace(os.Getenv(envProtocol))
	}
	var exp sdktrace.SpanExporter
	switch protocol {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("%s=%s: use grpc or http/protobuf", envProtocol, protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	// service.name defaults to tokengate; OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES (read after it) win.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", defaultServiceName)),
		resource.WithTelemetrySDK(), resource.WithHost(), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(linkedSampler{base: sampler}),
	)
	return &Tracing{provider: tp, propagator: prop}, nil
}

// On reports whether spans are made and exported.
func (t *Tracing) On() bool { return t != nil && t.provider != nil }

// TracerProvider is the provider the admission layer and the faces start
// their spans with: nil when tracing is off, so that they can skip the
// span's work with one check.
func (t *Tracing) TracerProvider() trace.TracerProvider {
	if !t.On() {
		return nil
	}
	return t.provider
}

// Extract returns ctx with the caller's trace context read from carrier (a
// request's headers, a gRPC call's metadata): the spans started under it
// are children of the caller's span. Off, ctx as it is.
func (t *Tracing) Extract(ctx context.Context, carrier propagation.TextMapCarrier) context.Context {
	if !t.On() {
		return ctx
	}
	return t.propagator.Extract(ctx, carrier)
}

// Inject writes ctx's trace context into carrier (an upstream request's
// headers). Off, it writes nothing.
func (t *Tracing) Inject(ctx context.Context, carrier propagation.TextMapCarrier) {
	if t.On() {
		t.propagator.Inject(ctx, carrier)
	}
}

// ForceFlush exports every span ended so far.
func (t *Tracing) ForceFlush(ctx context.Context) error {
	if !t.On() {
		return nil
	}
	return t.provider.ForceFlush(ctx)
}

// Shutdown exports what is left and stops the exporter.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if !t.On() {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// samplerFromEnv is the sampler OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG name, as the SDK reads them, with the SDK's
// default (parentbased_always_on) when unset.
func samplerFromEnv() (sdktrace.Sampler, error) {
	name := strings.ToLower(strings.TrimSpace(os.Getenv(envSampler)))
	arg := strings.TrimSpace(os.Getenv(envSamplerArg))
	ratio := func() (sdktrace.Sampler, error) {
		if arg == "" {
			return sdktrace.TraceIDRatioBased(1), nil
		}
		v, err := strconv.ParseFloat(arg, 64)
		if err != nil || v < 0 || v > 1 {
			return nil, fmt.Errorf("%s=%s: a ratio from 0 to 1", envSamplerArg, arg)
		}
		return sdktrace.TraceIDRatioBased(v), nil
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "traceidratio":
		return ratio()
	case "parentbased_traceidratio":
		s, err := ratio()
		if err != nil {
			return nil, err
		}
		return sdktrace.ParentBased(s), nil
	}
	return nil, fmt.Errorf("%s=%s: use always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio", envSampler, name)
}

// propagatorFromEnv is the propagator OTEL_PROPAGATORS names: tracecontext
// and baggage by default, as the specification says.
func propagatorFromEnv() (propagation.TextMapPropagator, error) {
	v := strings.TrimSpace(os.Getenv(envPropagators))
	if v == "" {
		v = "tracecontext,baggage"
	}
	var ps []propagation.TextMapPropagator
	for _, name := range strings.Split(v, ",") {
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "tracecontext":
			ps = append(ps, propagation.TraceContext{})
		case "baggage":
			ps = append(ps, propagation.Baggage{})
		case "none", "":
		default:
			return nil, fmt.Errorf("%s: %q is not supported (tracecontext, baggage or none)", envPropagators, name)
		}
	}
	return propagation.NewCompositeTextMapPropagator(ps...), nil
}

// linkedSampler samples as base does, but for a root span that links to a
// sampled span: a pipeline transaction is a root (it decides for many
// callers), and a decision that was sampled links to it, so the
// transaction is kept whenever one of its decisions is. A transaction none
// of whose decisions is sampled is sampled as base says.
type linkedSampler struct{ base sdktrace.Sampler }

func (s linkedSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if !trace.SpanContextFromContext(p.ParentContext).IsValid() {
		for _, l := range p.Links {
			if l.SpanContext.IsSampled() {
				return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample,
					Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
			}
		}
	}
	return s.base.ShouldSample(p)
}

func (s linkedSampler) Description() string { return "Linked{" + s.base.Description() + "}" }
