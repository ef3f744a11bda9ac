package api_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/otlptest"
)

// TestAPIDecisionSpans: the HTTP API's admission, settle and release are
// decision spans in the trace of the caller's traceparent header, children
// of its span, linked to their transactions; the sweep's expiry is a span
// of its own; over OTLP/HTTP. The admission latency's bucket carries the
// trace as an exemplar on /metrics in OpenMetrics.
func TestAPIDecisionSpans(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "")
	rcv, tr := otlptest.Traced(t, "http/protobuf")
	var now atomic.Pointer[time.Time]
	start := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	now.Store(&start)
	b := setupAPI(t, func(c *testConfig) {
		c.Tracing = tr
		c.Store = account.NewStore(c.DB).WithClock(func() time.Time { return *now.Load() })
	})
	key := b.tenant(t, "acme", rule.Limits{TokensCapacity: 100000, TokensRateMicro: rule.Micro})
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	parent := func(span string) string { return "00-" + traceID + "-" + span + "-01" }

	var adm struct{ ID string }
	r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(50, "hello"), "traceparent", parent("b7ad6b7169203331"))
	if r.Code != http.StatusCreated {
		t.Fatalf("admission: %d %s", r.Code, r.Body)
	}
	r.json(&adm)
	if r := b.call(t, key, http.MethodPost, "/v1/admissions/"+adm.ID+"/settle", `{"usage":{"prompt_tokens":9,"completion_tokens":21}}`,
		"traceparent", parent("b7ad6b7169203332")); r.Code != http.StatusOK {
		t.Fatalf("settle: %d %s", r.Code, r.Body)
	}
	var second, third struct{ ID string }
	b.call(t, key, http.MethodPost, "/v1/admissions", chat(50, "again"), "traceparent", parent("b7ad6b7169203333")).json(&second)
	if r := b.call(t, key, http.MethodPost, "/v1/admissions/"+second.ID+"/release", ``, "traceparent", parent("b7ad6b7169203334")); r.Code != http.StatusOK {
		t.Fatalf("release: %d %s", r.Code, r.Body)
	}
	b.call(t, key, http.MethodPost, "/v1/admissions", chat(50, "never settled"), "traceparent", parent("b7ad6b7169203335")).json(&third)
	later := start.Add(rule.DefaultReservationTTL + time.Minute)
	now.Store(&later)
	if n, err := b.rep.Admitter.SweepOnce(ctx); err != nil || n != 1 {
		t.Fatalf("sweep: %d expired, %v", n, err)
	}

	// The exemplar: the admission latency's bucket names the trace.
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, req)
	metrics, _ := io.ReadAll(rec.Body)
	if !exemplarOf(string(metrics), `tokengate_admission_duration_seconds_bucket{face="api"`, traceID) {
		t.Errorf("no exemplar of trace %s on the admission latency:\n%s", traceID, grepLines(string(metrics), "tokengate_admission_duration_seconds_bucket"))
	}
	if !exemplarOf(string(metrics), `tokengate_http_request_duration_seconds_bucket{method="POST",route="/v1/admissions"`, traceID) {
		t.Errorf("no exemplar of trace %s on the HTTP latency:\n%s", traceID, grepLines(string(metrics), "tokengate_http_request_duration_seconds_bucket"))
	}

	if err := tr.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
	spans := rcv.Wait(t, "3 admissions, a settle, a release and an expiry", func(s []otlptest.Span) bool {
		return len(otlptest.Named(s, admission.SpanAdmission)) == 3 && len(otlptest.Named(s, admission.SpanSettle)) == 1 &&
			len(otlptest.Named(s, admission.SpanRelease)) == 1 && len(otlptest.Named(s, admission.SpanExpire)) == 1 &&
			len(otlptest.Named(s, admission.SpanTransaction)) == 6
	})
	first, err := b.store.AdmissionGet(ctx, "acme", adm.ID)
	if err != nil {
		t.Fatal(err)
	}
	under := func(span string) otlptest.Span {
		t.Helper()
		for _, s := range spans {
			if s.ParentSpanID == span {
				return s
			}
		}
		t.Fatalf("no span under %s", span)
		return otlptest.Span{}
	}
	for _, c := range []struct {
		span otlptest.Span
		name string
		want map[string]any
	}{
		{under("b7ad6b7169203331"), admission.SpanAdmission, map[string]any{"tokengate.face": "api", "tokengate.tenant": "acme",
			"tokengate.model": "gpt-4o", "tokengate.outcome": "admitted", "tokengate.decided_by": "store", "tokengate.admission_id": adm.ID,
			"tokengate.estimate.input_tokens": first.Estimate.InputTokens, "tokengate.estimate.output_tokens": int64(50),
			"tokengate.estimate.cost": first.Estimate.Cost, "tokengate.batch.size": int64(1)}},
		{under("b7ad6b7169203332"), admission.SpanSettle, map[string]any{"tokengate.face": "api", "tokengate.tenant": "acme",
			"tokengate.model": "gpt-4o", "tokengate.outcome": "applied", "tokengate.decided_by": "store", "tokengate.admission_id": adm.ID,
			"tokengate.estimate.cost": first.Estimate.Cost, "tokengate.actual.input_tokens": int64(9),
			"tokengate.actual.output_tokens": int64(21), "tokengate.actual.cost": *first.ActualCost, "tokengate.batch.size": int64(1)}},
		{under("b7ad6b7169203334"), admission.SpanRelease, map[string]any{"tokengate.face": "api", "tokengate.tenant": "acme",
			"tokengate.outcome": "applied", "tokengate.decided_by": "store", "tokengate.admission_id": second.ID,
			"tokengate.actual.cost": int64(0), "tokengate.batch.size": int64(1)}},
	} {
		if c.span.Name != c.name || c.span.TraceID != traceID {
			t.Errorf("%s: a %s in trace %s, want one in %s", c.name, c.span.Name, c.span.TraceID, traceID)
		}
		for k, v := range c.want {
			if c.span.Attrs[k] != v {
				t.Errorf("%s: %s = %v (%T), want %v (%T)", c.name, k, c.span.Attrs[k], c.span.Attrs[k], v, v)
			}
		}
		if len(c.span.Links) != 1 {
			t.Fatalf("%s: links %v, want its transaction", c.name, c.span.Links)
		}
		if tx, ok := otlptest.ByID(spans, c.span.Links[0].SpanID); !ok || tx.Name != admission.SpanTransaction {
			t.Errorf("%s: its link %v is no transaction span received", c.name, c.span.Links[0])
		}
	}
	// The expiry is the sweep's, in a trace of its own.
	exp := otlptest.Named(spans, admission.SpanExpire)[0]
	for k, v := range map[string]any{"tokengate.face": "sweep", "tokengate.tenant": "acme", "tokengate.expired": int64(1), "tokengate.outcome": "applied"} {
		if exp.Attrs[k] != v {
			t.Errorf("expiry: %s = %v, want %v", k, exp.Attrs[k], v)
		}
	}
	if exp.ParentSpanID != "" || exp.TraceID == traceID || len(exp.Links) != 1 {
		t.Errorf("expiry: parent %q trace %s links %v, want a root with its transaction", exp.ParentSpanID, exp.TraceID, exp.Links)
	}
	if got := exp.Resource["service.name"]; got != "tokengate" {
		t.Errorf("service.name = %v", got)
	}
}

// TestAPISamplerAtZeroSendsNothing: with OTEL_TRACES_SAMPLER=always_off,
// a sampled caller's admission, settle and transaction export nothing,
// and the admission latency has no exemplar (the HTTP latency's is the
// caller's own sampled trace, which tokengate does not decide).
func TestAPISamplerAtZeroSendsNothing(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "always_off")
	rcv, tr := otlptest.Traced(t, "grpc")
	b := setupAPI(t, func(c *testConfig) { c.Tracing = tr })
	key := b.tenant(t, "acme", rule.Limits{TokensCapacity: 100000, TokensRateMicro: rule.Micro})
	tp := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	var adm struct{ ID string }
	b.call(t, key, http.MethodPost, "/v1/admissions", chat(50, "hello"), "traceparent", tp).json(&adm)
	if r := b.call(t, key, http.MethodPost, "/v1/admissions/"+adm.ID+"/settle", `{"usage":{"prompt_tokens":9,"completion_tokens":21}}`,
		"traceparent", tp); r.Code != http.StatusOK {
		t.Fatalf("settle: %d %s", r.Code, r.Body)
	}
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, req)
	if strings.Contains(grepLines(rec.Body.String(), "tokengate_admission_duration_seconds"), "trace_id") {
		t.Error("an exemplar of the admission latency at sampler 0")
	}
	if err := tr.Shutdown(ctx); err != nil { // exports whatever is left
		t.Fatal(err)
	}
	if n := len(rcv.Spans()); n != 0 {
		t.Fatalf("received %d spans at sampler 0", n)
	}
}

// exemplarOf reports whether a line of metrics starting with prefix has an
// exemplar of traceID.
func exemplarOf(metrics, prefix, traceID string) bool {
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, prefix) && strings.Contains(line, `# {`) && strings.Contains(line, `trace_id="`+traceID+`"`) {
			return true
		}
	}
	return false
}

func grepLines(s, what string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, what) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestAPIDecisionSpansDuringAnOutage: with the store cut off, an
// admission decided under the local policy and its journaled settle say
// decided_by local, beside one the store decided.
func TestAPIDecisionSpansDuringAnOutage(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "")
	rcv, tr := otlptest.Traced(t, "grpc")
	b := setupOutage(t, rule.PolicyLocal, nil, func(c *testConfig) { c.Tracing = tr })
	key := b.tenant(t, "acme", lim(2_000, "0.1"))
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "x"), "traceparent", "00-"+traceID+"-00000000000000a1-01"); r.Code != http.StatusCreated {
		t.Fatal(r.Body)
	}
	b.proxy.cut()
	r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "x"), "traceparent", "00-"+traceID+"-00000000000000a2-01")
	if r.Code != http.StatusCreated || r.Header().Get("X-Tokengate-Decided-By") != "local" {
		t.Fatalf("during the outage: %d %s", r.Code, r.Body)
	}
	var a admitted
	r.json(&a)
	if r := b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/settle", `{"usage":{"prompt_tokens":8,"completion_tokens":20}}`,
		"traceparent", "00-"+traceID+"-00000000000000a3-01"); r.Code != http.StatusAccepted {
		t.Fatalf("settle during the outage: %d %s", r.Code, r.Body)
	}
	if err := tr.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
	spans := rcv.Wait(t, "2 admissions and a settle", func(s []otlptest.Span) bool {
		return len(otlptest.Named(s, admission.SpanAdmission)) == 2 && len(otlptest.Named(s, admission.SpanSettle)) == 1
	})
	want := map[string]map[string]any{
		"00000000000000a1": {"tokengate.outcome": "admitted", "tokengate.decided_by": "store"},
		"00000000000000a2": {"tokengate.outcome": "admitted", "tokengate.decided_by": "local", "tokengate.admission_id": a.ID},
		"00000000000000a3": {"tokengate.outcome": "journaled", "tokengate.decided_by": "local", "tokengate.admission_id": a.ID},
	}
	for _, s := range spans {
		w, ok := want[s.ParentSpanID]
		if !ok || s.TraceID != traceID {
			continue
		}
		delete(want, s.ParentSpanID)
		for k, v := range w {
			if s.Attrs[k] != v {
				t.Errorf("%s under %s: %s = %v, want %v", s.Name, s.ParentSpanID, k, s.Attrs[k], v)
			}
		}
	}
	if len(want) != 0 {
		t.Fatalf("no decision spans under %v", want)
	}
}
