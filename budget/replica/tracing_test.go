package replica_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/integration/otlptest"
)

// unsetOTEL clears the variables a developer's shell may have set, for the
// test.
func unsetOTEL(t *testing.T) {
	t.Helper()
	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
		"OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_PROPAGATORS"} {
		t.Setenv(k, "")
	}
}

func TestTracingOffUnlessConfigured(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"nothing set", nil},
		{"a sampler alone", map[string]string{"OTEL_TRACES_SAMPLER": "always_on", "OTEL_SERVICE_NAME": "x"}},
		{"sdk disabled", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}},
		{"exporter none", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unsetOTEL(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			tr, err := replica.TracingFromEnv(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if tr.On() || tr.TracerProvider() != nil {
				t.Fatalf("tracing is on with %v", tc.env)
			}
			// A nil Tracing's methods are no-ops.
			ctx := context.Background()
			if got := tr.Extract(ctx, nil); got != ctx {
				t.Fatal("Extract changed the context while off")
			}
			if err := tr.ForceFlush(ctx); err != nil {
				t.Fatal(err)
			}
			if err := tr.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestTracingRefusesUnknownValues(t *testing.T) {
	for _, tc := range []struct{ key, value, want string }{
		{"OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "use grpc or http/protobuf"},
		{"OTEL_TRACES_SAMPLER", "always-on", "OTEL_TRACES_SAMPLER=always-on"},
		{"OTEL_TRACES_SAMPLER_ARG", "1.5", "a ratio from 0 to 1"},
		{"OTEL_TRACES_EXPORTER", "zipkin", "OTLP only"},
		{"OTEL_PROPAGATORS", "b3", "not supported"},
	} {
		t.Run(tc.key, func(t *testing.T) {
			unsetOTEL(t)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
			if tc.key == "OTEL_TRACES_SAMPLER_ARG" {
				t.Setenv("OTEL_TRACES_SAMPLER", "traceidratio")
			}
			t.Setenv(tc.key, tc.value)
			tr, err := replica.TracingFromEnv(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one saying %q", err, tc.want)
			}
			if tr != nil {
				t.Fatal("a Tracing came back with the error")
			}
		})
	}
}

// TestTracingExportsOverBothProtocols exports a span over gRPC and over
// HTTP, with the service name from OTEL_SERVICE_NAME (tokengate without
// it), and the sampler from OTEL_TRACES_SAMPLER.
func TestTracingExportsOverBothProtocols(t *testing.T) {
	for _, tc := range []struct{ protocol, service, want string }{
		{"grpc", "", "tokengate"},
		{"http/protobuf", "gate-eu", "gate-eu"},
	} {
		t.Run(tc.protocol, func(t *testing.T) {
			unsetOTEL(t)
			rcv := otlptest.Start(t)
			rcv.Setenv(t, tc.protocol)
			if tc.service != "" {
				t.Setenv("OTEL_SERVICE_NAME", tc.service)
			}
			tr, err := replica.TracingFromEnv(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
			_, span := tr.TracerProvider().Tracer("test").Start(context.Background(), "probe")
			span.End()
			if err := tr.ForceFlush(context.Background()); err != nil {
				t.Fatal(err)
			}
			got := rcv.Wait(t, "probe span", func(s []otlptest.Span) bool { return len(otlptest.Named(s, "probe")) == 1 })
			p := otlptest.Named(got, "probe")[0]
			if p.Resource["service.name"] != tc.want {
				t.Fatalf("service.name = %v, want %s", p.Resource["service.name"], tc.want)
			}
			if p.TraceID != span.SpanContext().TraceID().String() {
				t.Fatalf("trace id %s, want %s", p.TraceID, span.SpanContext().TraceID())
			}
		})
	}
}

// TestTracingSamplerAtZeroSendsNothing: always_off and traceidratio 0
// make no span that is exported, even with a sampled caller.
func TestTracingSamplerAtZeroSendsNothing(t *testing.T) {
	for _, tc := range []struct{ sampler, arg string }{{"always_off", ""}, {"traceidratio", "0"}} {
		t.Run(tc.sampler, func(t *testing.T) {
			unsetOTEL(t)
			rcv := otlptest.Start(t)
			rcv.Setenv(t, "grpc")
			t.Setenv("OTEL_TRACES_SAMPLER", tc.sampler)
			t.Setenv("OTEL_TRACES_SAMPLER_ARG", tc.arg)
			tr, err := replica.TracingFromEnv(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			tracer := tr.TracerProvider().Tracer("test")
			ctx, root := tracer.Start(context.Background(), "root")
			_, child := tracer.Start(ctx, "child", trace.WithLinks(trace.Link{SpanContext: root.SpanContext()}))
			child.End()
			root.End()
			if root.IsRecording() || child.IsRecording() {
				t.Fatal("a span records at sampler 0")
			}
			if err := tr.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if n := len(rcv.Spans()); n != 0 {
				t.Fatalf("received %d spans at sampler 0", n)
			}
		})
	}
}

// TestTracingKeepsTransactionsOfSampledDecisions: a root span linked from
// a sampled span is sampled, whatever the ratio, so a transaction is kept
// when one of the decisions it carried is.
func TestTracingKeepsTransactionsOfSampledDecisions(t *testing.T) {
	unsetOTEL(t)
	rcv := otlptest.Start(t)
	rcv.Setenv(t, "http/protobuf")
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0")
	tr, err := replica.TracingFromEnv(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tr.Shutdown(context.Background()) }()
	tracer := tr.TracerProvider().Tracer("test")
	// A caller that sampled its trace: the decision follows its parent.
	sampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled, Remote: true})
	_, decision := tracer.Start(trace.ContextWithRemoteSpanContext(context.Background(), sampled), "decision")
	_, tx := tracer.Start(context.Background(), "tx", trace.WithLinks(trace.Link{SpanContext: decision.SpanContext()}))
	_, lone := tracer.Start(context.Background(), "lone")
	if !decision.IsRecording() || !tx.IsRecording() || lone.IsRecording() {
		t.Fatalf("recording: decision %v, tx %v, lone %v; want true, true, false", decision.IsRecording(), tx.IsRecording(), lone.IsRecording())
	}
	tx.End()
	decision.End()
	lone.End()
	_ = tr.ForceFlush(context.Background())
	got := rcv.Wait(t, "tx and decision", func(s []otlptest.Span) bool { return len(s) == 2 })
	d := otlptest.Named(got, "decision")[0]
	if d.TraceID != sampled.TraceID().String() || d.ParentSpanID != sampled.SpanID().String() {
		t.Fatalf("decision in trace %s under %s, want %s under %s", d.TraceID, d.ParentSpanID, sampled.TraceID(), sampled.SpanID())
	}
}

// TestTracingOnByExporterAlone: OTEL_TRACES_EXPORTER=otlp asks for the
// default endpoint, as the specification says.
func TestTracingOnByExporterAlone(t *testing.T) {
	unsetOTEL(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	tr, err := replica.TracingFromEnv(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !tr.On() {
		t.Fatal("OTEL_TRACES_EXPORTER=otlp left tracing off")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = tr.Shutdown(ctx) // nothing listens on the default endpoint: nothing to export either
}
