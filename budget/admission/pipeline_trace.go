package admission

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokengate/tokengate/budget/account"
)

// The transaction span (account.PipelineConfig.Tracer): one per transaction
// a pipeline runs, a root of its own trace, since it decides for many
// callers. Each decision span it carried links to it and is told the
// batch's size and how long the decision queued for it. The pipeline tells
// pipeTracer what happens; the spans are made here, so that the domain's
// root imports no tracing library.
const (
	// SpanTransaction names a pipeline transaction's span.
	SpanTransaction = "tokengate.transaction"
	// PipelineTracerName is the instrumentation scope of the pipeline's
	// spans.
	PipelineTracerName = "github.com/tokengate/tokengate/budget/account"

	AttrBatchSize       = attribute.Key("tokengate.batch.size")
	AttrBatchTenants    = attribute.Key("tokengate.batch.tenants")
	AttrBatchRoundTrips = attribute.Key("tokengate.batch.round_trips")
	AttrBatchReserves   = attribute.Key("tokengate.batch.reserves")
	AttrBatchEnds       = attribute.Key("tokengate.batch.ends")
	AttrBatchExpiries   = attribute.Key("tokengate.batch.expiries")
	// AttrQueuedMS is how long a decision waited in its pipeline for its
	// transaction to begin, in milliseconds.
	AttrQueuedMS = attribute.Key("tokengate.queued_ms")
)

// pipeTracer traces a pipeline's transactions with OpenTelemetry.
type pipeTracer struct{ tracer trace.Tracer }

// newPipeTracer is the pipeline's tracer over tp, or nil (no tracing) when
// tp is nil.
func newPipeTracer(tp trace.TracerProvider) account.PipelineTracer {
	if tp == nil {
		return nil
	}
	return pipeTracer{tp.Tracer(PipelineTracerName)}
}

// callTrace is a call's recording span, and when the call was queued.
type callTrace struct {
	span   trace.Span
	queued time.Time
}

// Call remembers the caller's span, when it records, for the transaction
// that will carry the call.
func (pipeTracer) Call(ctx context.Context) account.TracedCall {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		return &callTrace{span: span, queued: time.Now()}
	}
	return nil
}

// txTrace is one traced transaction, and the calls it carries.
type txTrace struct {
	span  trace.Span
	calls []*callTrace
	began time.Time
}

// Begin starts the span of a transaction, linked from each of the batch's
// recorded decisions.
func (p pipeTracer) Begin(calls []account.TracedCall) account.TracedTx {
	t := &txTrace{began: time.Now()}
	var links []trace.Link
	for _, c := range calls {
		if c, ok := c.(*callTrace); ok {
			t.calls = append(t.calls, c)
			links = append(links, trace.Link{SpanContext: c.span.SpanContext()})
		}
	}
	_, t.span = p.tracer.Start(context.Background(), SpanTransaction, trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(links...),
		trace.WithNewRoot(), trace.WithAttributes(attribute.String("db.system.name", "postgresql")))
	return t
}

// End ends a transaction's span with what it decided, and tells each of
// its recorded decisions which transaction carried it.
func (t *txTrace) End(f account.BatchFigures, err error) {
	if t.span.IsRecording() {
		t.span.SetAttributes(AttrBatchSize.Int(f.Size), AttrBatchTenants.Int(f.Tenants),
			AttrBatchRoundTrips.Int64(f.RoundTrips), AttrBatchReserves.Int(f.Reserves), AttrBatchEnds.Int(f.Ends),
			AttrBatchExpiries.Int(f.Expiries))
		if err != nil {
			t.span.SetStatus(codes.Error, err.Error())
		}
	}
	t.span.End()
	link := trace.Link{SpanContext: t.span.SpanContext()}
	for _, c := range t.calls {
		c.span.AddLink(link)
		c.span.SetAttributes(AttrBatchSize.Int(f.Size),
			AttrQueuedMS.Float64(float64(t.began.Sub(c.queued).Microseconds())/1000))
	}
}
