package rls_test

import (
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/metadata"

	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/integration/otlptest"
)

// traced starts a receiver, points the OTEL_ variables at it over
// protocol and builds the replica's tracing from them.
func traced(t *testing.T, protocol string) (*otlptest.Receiver, *replica.Tracing) {
	t.Helper()
	t.Setenv("OTEL_TRACES_SAMPLER", "")
	t.Setenv("OTEL_SERVICE_NAME", "")
	return otlptest.Traced(t, protocol)
}

// TestRLSDecisionSpans: a gateway's reserve, its refusal and its stream-end
// settle are decision spans in the trace of the traceparent metadata Envoy
// sends, children of its span, each linked to the transaction that decided
// it; over OTLP/gRPC. A refusal's transaction rolls back instead of
// committing: two round trips too.
func TestRLSDecisionSpans(t *testing.T) {
	rcv, tr := traced(t, "grpc")
	b := setupTraced(t, nil, tr)
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	call := func(spanID string, hits uint32, kv ...string) *rlsv3.RateLimitResponse {
		t.Helper()
		cctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+b.gateway,
			"traceparent", "00-"+traceID+"-"+spanID+"-01")
		resp, err := b.client.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "tokengate", HitsAddend: hits,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(kv...)}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// A first decision reads what a replica caches (the pool routes, the
	// price book): the ones after it cost the lock and the commit alone.
	if r := call("00f067aa0ba902b6", 1, "tenant", "globex", "request_id", "warm-up"); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("warm-up: %v", r.OverallCode)
	}
	if r := call("00f067aa0ba902b7", 100, "tenant", "acme", "model", "gpt-4o", "request_id", "r-1"); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("reserve: %v", r.OverallCode)
	}
	if r := call("00f067aa0ba902b8", 60, "tenant", "acme", "model", "gpt-4o", "request_id", "r-1", "phase", "response"); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("settle: %v", r.OverallCode)
	}
	if r := call("00f067aa0ba902b9", 990, "tenant", "acme", "model", "gpt-4o", "request_id", "r-2"); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("refusal: %v", r.OverallCode)
	}
	if err := tr.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
	spans := rcv.Wait(t, "3 admissions, a settle and 4 transactions", func(s []otlptest.Span) bool {
		return len(otlptest.Named(s, admission.SpanAdmission)) == 3 && len(otlptest.Named(s, admission.SpanSettle)) == 1 &&
			len(otlptest.Named(s, admission.SpanTransaction)) == 4
	})
	under := func(parent string) otlptest.Span {
		t.Helper()
		for _, s := range spans {
			if s.ParentSpanID == parent {
				return s
			}
		}
		t.Fatalf("no span under %s", parent)
		return otlptest.Span{}
	}
	admitted, settle, refused := under("00f067aa0ba902b7"), under("00f067aa0ba902b8"), under("00f067aa0ba902b9")
	if admitted.Name != admission.SpanAdmission || settle.Name != admission.SpanSettle || refused.Name != admission.SpanAdmission {
		t.Fatalf("spans %s, %s, %s", admitted.Name, settle.Name, refused.Name)
	}
	for _, c := range []struct {
		span   otlptest.Span
		parent string
		want   map[string]any
	}{
		{admitted, "00f067aa0ba902b7", map[string]any{"tokengate.face": "rls", "tokengate.tenant": "acme", "tokengate.model": "gpt-4o",
			"tokengate.outcome": "admitted", "tokengate.decided_by": "store", "tokengate.estimate.cost": int64(100),
			"tokengate.estimate.input_tokens": int64(100), "tokengate.batch.size": int64(1)}},
		{refused, "00f067aa0ba902b9", map[string]any{"tokengate.face": "rls", "tokengate.tenant": "acme", "tokengate.outcome": "rejected",
			"tokengate.limit": "tokens", "tokengate.level": "acme", "tokengate.decided_by": "store", "tokengate.estimate.cost": int64(990),
			"tokengate.batch.size": int64(1)}},
		{settle, "00f067aa0ba902b8", map[string]any{"tokengate.face": "rls", "tokengate.tenant": "acme", "tokengate.model": "gpt-4o",
			"tokengate.outcome": "applied", "tokengate.decided_by": "store", "tokengate.estimate.cost": int64(100),
			"tokengate.actual.input_tokens": int64(60), "tokengate.actual.cost": int64(60), "tokengate.balance_delta": float64(40),
			"tokengate.batch.size": int64(1)}},
	} {
		checkDecision(t, spans, c.span, traceID, c.parent, c.want)
	}
	if admitted.Attrs["tokengate.admission_id"] == "" || admitted.Attrs["tokengate.admission_id"] != settle.Attrs["tokengate.admission_id"] {
		t.Fatalf("admission ids: %v reserved, %v settled", admitted.Attrs["tokengate.admission_id"], settle.Attrs["tokengate.admission_id"])
	}
}

// checkDecision checks a decision span: its trace and parent (the
// caller's), its attributes, and its link to a transaction span that
// decided one request of one tenant in two round trips (the lock and the
// commit).
func checkDecision(t *testing.T, spans []otlptest.Span, s otlptest.Span, traceID, parent string, want map[string]any) {
	t.Helper()
	if s.TraceID != traceID || s.ParentSpanID != parent {
		t.Errorf("%s: trace %s under %s, want %s under %s", s.Name, s.TraceID, s.ParentSpanID, traceID, parent)
	}
	for k, v := range want {
		if s.Attrs[k] != v {
			t.Errorf("%s: %s = %v (%T), want %v (%T)", s.Name, k, s.Attrs[k], s.Attrs[k], v, v)
		}
	}
	if len(s.Links) != 1 {
		t.Fatalf("%s: %d links, want 1 (its transaction)", s.Name, len(s.Links))
	}
	tx, ok := otlptest.ByID(spans, s.Links[0].SpanID)
	if !ok || tx.Name != admission.SpanTransaction || tx.TraceID != s.Links[0].TraceID {
		t.Fatalf("%s links to %+v, not to a received transaction span", s.Name, s.Links[0])
	}
	if tx.ParentSpanID != "" || tx.Kind != "SPAN_KIND_CLIENT" {
		t.Errorf("transaction: parent %q kind %s, want a root client span", tx.ParentSpanID, tx.Kind)
	}
	for k, v := range map[string]any{"tokengate.batch.size": int64(1), "tokengate.batch.tenants": int64(1),
		"tokengate.batch.round_trips": int64(2), "db.system.name": "postgresql"} {
		if tx.Attrs[k] != v {
			t.Errorf("transaction of %s: %s = %v, want %v", s.Name, k, tx.Attrs[k], v)
		}
	}
	if len(tx.Links) != 1 || tx.Links[0].SpanID != s.SpanID {
		t.Errorf("transaction of %s links to %v, want the decision %s", s.Name, tx.Links, s.SpanID)
	}
}
