package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/otlptest"
)

// TestProxyTraces: an OpenAI and an Anthropic call through the proxy, each
// in its caller's trace (traceparent). The upstream call is a client span
// with the GenAI conventions and the usage the upstream reported, and the
// upstream sees traceparent naming that span; the admission and the
// settle are decision spans under the caller's span, linked to their
// transactions.
func TestProxyTraces(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
	rcv, tr := otlptest.Traced(t, "grpc")
	b := setupTraced(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1}, nil, tr)
	var h heard
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		h.add(r, body)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/messages" {
			fmt.Fprint(w, claudeAnswer)
			return
		}
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}`)
	}
	const openaiTrace, claudeTrace = "11111111111111111111111111111111", "22222222222222222222222222222222"
	const openaiCaller, claudeCaller = "1111111111111111", "2222222222222222"
	if code, _, body := b.post(t, `{"model":"gpt-4o","max_tokens":64,"messages":[{"role":"user","content":"Say hello."}]}`,
		"traceparent", "00-"+openaiTrace+"-"+openaiCaller+"-01"); code != http.StatusOK {
		t.Fatalf("chat: %d %s", code, body)
	}
	req, _ := http.NewRequest(http.MethodPost, b.base+"/v1/messages",
		strings.NewReader(`{"model":"`+claudeModel+`","max_tokens":1024,"messages":[{"role":"user","content":"Say hello to the platform team."}]}`))
	req.Header.Set("X-Api-Key", b.key)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Traceparent", "00-"+claudeTrace+"-"+claudeCaller+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("messages: %d", resp.StatusCode)
	}
	if err := tr.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
	spans := rcv.Wait(t, "2 upstream calls, 2 admissions, 2 settles", func(s []otlptest.Span) bool {
		return len(otlptest.Named(s, "chat gpt-4o")) == 1 && len(otlptest.Named(s, "chat "+claudeModel)) == 1 &&
			len(otlptest.Named(s, admission.SpanAdmission)) == 2 && len(otlptest.Named(s, admission.SpanSettle)) == 2 &&
			len(otlptest.Named(s, admission.SpanTransaction)) == 4
	})
	as := b.admissions(t)
	for i, c := range []struct {
		name, trace, caller, provider string
		in, out                       int64
	}{
		{"chat gpt-4o", openaiTrace, openaiCaller, "openai", 11, 7},
		{"chat " + claudeModel, claudeTrace, claudeCaller, "anthropic", 100 + 200 + 1000, 40},
	} {
		up := otlptest.Named(spans, c.name)[0]
		if up.Kind != "SPAN_KIND_CLIENT" || up.TraceID != c.trace || up.ParentSpanID != c.caller {
			t.Errorf("%s: %s in %s under %s, want a client span in %s under %s", c.name, up.Kind, up.TraceID, up.ParentSpanID, c.trace, c.caller)
		}
		model := strings.TrimPrefix(c.name, "chat ")
		for k, v := range map[string]any{"gen_ai.operation.name": "chat", "gen_ai.provider.name": c.provider, "gen_ai.request.model": model,
			"gen_ai.usage.input_tokens": c.in, "gen_ai.usage.output_tokens": c.out, "http.response.status_code": int64(200),
			"server.address": "127.0.0.1", "tokengate.admission_id": as[i].ID} {
			if up.Attrs[k] != v {
				t.Errorf("%s: %s = %v (%T), want %v (%T)", c.name, k, up.Attrs[k], up.Attrs[k], v, v)
			}
		}
		// The upstream was called in the trace, as the child of this span.
		if got, want := h.headers[i].Get("Traceparent"), "00-"+c.trace+"-"+up.SpanID+"-01"; got != want {
			t.Errorf("%s: the upstream saw traceparent %q, want %q", c.name, got, want)
		}
		// The admission and the settle are children of the caller's span.
		var decisions []otlptest.Span
		for _, s := range spans {
			if s.TraceID == c.trace && s.ParentSpanID == c.caller && s.Name != c.name {
				decisions = append(decisions, s)
			}
		}
		if len(decisions) != 2 {
			t.Fatalf("%s: %d decision spans under the caller, want 2", c.name, len(decisions))
		}
		for _, d := range decisions {
			if d.Attrs["tokengate.face"] != "proxy" || d.Attrs["tokengate.admission_id"] != as[i].ID || d.Attrs["tokengate.model"] != model ||
				len(d.Links) != 1 {
				t.Errorf("%s: decision %s attrs %v links %v", c.name, d.Name, d.Attrs, d.Links)
			}
			if d.Name == admission.SpanSettle && d.Attrs["tokengate.actual.cost"] != *as[i].ActualCost {
				t.Errorf("%s: settled cost %v, want %d", c.name, d.Attrs["tokengate.actual.cost"], *as[i].ActualCost)
			}
		}
	}
}

// TestProxyPassesTraceparentWhileOff: with tracing off, the caller's
// traceparent and tracestate reach the upstream as they came.
func TestProxyPassesTraceparentWhileOff(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	var h heard
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		h.add(r, body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","model":"gpt-4o","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}`)
	}
	tp := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	if code, _, body := b.post(t, `{"model":"gpt-4o","max_tokens":64,"messages":[{"role":"user","content":"Say hello."}]}`,
		"traceparent", tp, "tracestate", "vendor=1"); code != http.StatusOK {
		t.Fatalf("chat: %d %s", code, body)
	}
	if got := h.headers[0].Get("Traceparent"); got != tp {
		t.Fatalf("traceparent %q, want %q", got, tp)
	}
	if got := h.headers[0].Get("Tracestate"); got != "vendor=1" {
		t.Fatalf("tracestate %q", got)
	}
}

// TestProxyTracesStreamsAndFailures: a streamed call's upstream span ends
// with the stream and holds the usage of its last chunk; an upstream that
// fails is an error span with its status, and the reservation's release is
// a decision span in the caller's trace.
func TestProxyTracesStreamsAndFailures(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "")
	rcv, tr := otlptest.Traced(t, "http/protobuf")
	b := setupTraced(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1}, nil, tr)
	b.up.behave = func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		if body["stream"] != true {
			http.Error(w, `{"error":{"message":"down","type":"server_error"}}`, http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		writeSSE(w, chatChunk("Hello"), chatChunk(" team!"), usageChunk, "[DONE]")
	}
	const trace = "33333333333333333333333333333333"
	if code, _, body := b.post(t, `{"model":"gpt-4o","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Say hello."}]}`,
		"traceparent", "00-"+trace+"-3333333333333331-01"); code != http.StatusOK || !strings.Contains(body, "team!") {
		t.Fatalf("stream: %d %s", code, body)
	}
	if code, _, body := b.post(t, `{"model":"gpt-4o","max_tokens":64,"messages":[{"role":"user","content":"Say hello."}]}`,
		"traceparent", "00-"+trace+"-3333333333333332-01"); code != http.StatusInternalServerError {
		t.Fatalf("failure: %d %s", code, body)
	}
	if err := tr.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
	spans := rcv.Wait(t, "2 upstream calls, a settle and a release", func(s []otlptest.Span) bool {
		return len(otlptest.Named(s, "chat gpt-4o")) == 2 && len(otlptest.Named(s, admission.SpanSettle)) == 1 &&
			len(otlptest.Named(s, admission.SpanRelease)) == 1
	})
	ups := otlptest.Named(spans, "chat gpt-4o")
	streamed, failed := ups[0], ups[1]
	if streamed.ParentSpanID != "3333333333333331" {
		streamed, failed = failed, streamed
	}
	if streamed.Attrs["gen_ai.usage.input_tokens"] != int64(20) || streamed.Attrs["gen_ai.usage.output_tokens"] != int64(9) ||
		streamed.StatusError || streamed.Attrs["http.response.status_code"] != int64(200) {
		t.Errorf("streamed: %+v", streamed)
	}
	if failed.ParentSpanID != "3333333333333332" || !failed.StatusError || failed.Attrs["http.response.status_code"] != int64(500) ||
		failed.Attrs["gen_ai.usage.input_tokens"] != nil {
		t.Errorf("failed: %+v", failed)
	}
	rel := otlptest.Named(spans, admission.SpanRelease)[0]
	if rel.TraceID != trace || rel.ParentSpanID != "3333333333333332" || rel.Attrs["tokengate.outcome"] != "applied" ||
		rel.Attrs["tokengate.face"] != "proxy" || rel.Attrs["tokengate.actual.cost"] != int64(0) {
		t.Errorf("release: %+v", rel)
	}
	set := otlptest.Named(spans, admission.SpanSettle)[0]
	if set.TraceID != trace || set.ParentSpanID != "3333333333333331" || set.Attrs["tokengate.actual.input_tokens"] != int64(20) ||
		set.Attrs["tokengate.actual.output_tokens"] != int64(9) {
		t.Errorf("settle: %+v", set)
	}
	// The stream's span ends after its last event: after the settle began.
	if !streamed.End.After(set.Start) {
		t.Errorf("the upstream span ended at %v, before the settle at %v", streamed.End, set.Start)
	}
}
