// Package otlptest is an OTLP trace receiver in the test process: the
// collector's trace service over gRPC and over HTTP (protobuf), as a
// collector serves them, keeping every span it receives for the test to
// read. Tests point the replica's tracing at it with the standard
// variables (Receiver.Setenv) and wait for spans by name.
//
// It is for tests only (TestLayout checks that no other code imports it).
package otlptest

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/tokengate/tokengate/budget/replica"
)

// Span is a received span, flattened.
type Span struct {
	Name         string
	Kind         string // SPAN_KIND_INTERNAL, SPAN_KIND_CLIENT, ...
	TraceID      string // hex
	SpanID       string
	ParentSpanID string // "" for a root
	Attrs        map[string]any
	Links        []Link
	Resource     map[string]any
	StatusError  bool
	Start, End   time.Time
}

// Link is a span's link to another span.
type Link struct{ TraceID, SpanID string }

// Receiver receives spans over OTLP/gRPC and OTLP/HTTP.
type Receiver struct {
	collectortrace.UnimplementedTraceServiceServer

	GRPCAddr string // host:port
	HTTPURL  string // http://host:port

	mu      sync.Mutex
	spans   []Span
	exports int
	changed chan struct{}
}

// Start starts a receiver on loopback ports, stopped when the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{changed: make(chan struct{})}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, r)
	go func() { _ = gs.Serve(gl) }()
	r.GRPCAddr = gl.Addr().String()

	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.serveHTTP)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(hl) }()
	r.HTTPURL = "http://" + hl.Addr().String()
	t.Cleanup(func() {
		gs.Stop()
		_ = hs.Close()
	})
	return r
}

// Traced starts a receiver, points the OTEL_ variables at it over
// protocol (the test's own OTEL_TRACES_SAMPLER and OTEL_SERVICE_NAME are
// kept), and builds the replica's tracing from them as serve does, shut
// down when the test ends.
func Traced(t testing.TB, protocol string) (*Receiver, *replica.Tracing) {
	t.Helper()
	rcv := Start(t)
	rcv.Setenv(t, protocol)
	tr, err := replica.TracingFromEnv(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !tr.On() {
		t.Fatal("otlptest: tracing is off with an endpoint set")
	}
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	return rcv, tr
}

// Setenv points the standard variables at the receiver, over protocol
// (grpc or http/protobuf), for the test (t.Setenv: the test may not be
// parallel).
func (r *Receiver) Setenv(t testing.TB, protocol string) {
	t.Helper()
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
	switch protocol {
	case "grpc":
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+r.GRPCAddr)
	default:
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.HTTPURL)
	}
	// Export at once, not every 5 s.
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
}

// Export is the gRPC trace service.
func (r *Receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.add(req)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var m collectortrace.ExportTraceServiceRequest
	if req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "protobuf only", http.StatusUnsupportedMediaType)
		return
	}
	if err := proto.Unmarshal(body, &m); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.add(&m)
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *Receiver) add(req *collectortrace.ExportTraceServiceRequest) {
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{Name: s.GetName(), Kind: s.GetKind().String(), TraceID: hex.EncodeToString(s.GetTraceId()),
					SpanID: hex.EncodeToString(s.GetSpanId()), ParentSpanID: hex.EncodeToString(s.GetParentSpanId()),
					Attrs: attrs(s.GetAttributes()), Resource: res, StatusError: s.GetStatus().GetCode() == 2,
					Start: time.Unix(0, int64(s.GetStartTimeUnixNano())), End: time.Unix(0, int64(s.GetEndTimeUnixNano()))}
				for _, l := range s.GetLinks() {
					sp.Links = append(sp.Links, Link{TraceID: hex.EncodeToString(l.GetTraceId()), SpanID: hex.EncodeToString(l.GetSpanId())})
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.exports++
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// attrs flattens OTLP attributes: strings, int64s, float64s and bools.
func attrs(kvs []*commonpb.KeyValue) map[string]any {
	out := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			out[kv.GetKey()] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			out[kv.GetKey()] = v.IntValue
		case *commonpb.AnyValue_DoubleValue:
			out[kv.GetKey()] = v.DoubleValue
		case *commonpb.AnyValue_BoolValue:
			out[kv.GetKey()] = v.BoolValue
		default:
			out[kv.GetKey()] = kv.GetValue().String()
		}
	}
	return out
}

// Spans is every span received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Exports is how many export requests arrived (an empty one counts).
func (r *Receiver) Exports() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exports
}

// Wait waits up to 10 s until match holds of the spans received, and
// returns them; it fails the test at the deadline.
func (r *Receiver) Wait(t testing.TB, what string, match func([]Span) bool) []Span {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		spans := append([]Span(nil), r.spans...)
		changed := r.changed
		r.mu.Unlock()
		if match(spans) {
			return spans
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("otlptest: no %s after 10 s; received %d spans: %v", what, len(spans), names(spans))
			return nil
		}
	}
}

// Named returns the spans of one name, in the order received.
func Named(spans []Span, name string) []Span {
	var out []Span
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// ByID finds a span by its id.
func ByID(spans []Span, id string) (Span, bool) {
	for _, s := range spans {
		if s.SpanID == id {
			return s, true
		}
	}
	return Span{}, false
}

func names(spans []Span) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name
	}
	return out
}
