package budget

import (
	"context"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// The transaction span (PipelineConfig.Tracer): one per transaction a
// pipeline runs, a root of its own trace, since it decides for many
// callers. Each decision span it carried links to it and is told the
// batch's size and how long the decision queued for it.
const (
	// SpanTransaction names a pipeline transaction's span.
	SpanTransaction = "tokengate.transaction"
	// TracerName is the instrumentation scope of the pipeline's spans.
	TracerName = "github.com/tokengate/tokengate/budget"

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

// tripsKey keys the round-trip counter of a traced transaction in its
// context.
type tripsKey struct{}

// countTrip counts a round trip of the transaction ctx belongs to, when
// its pipeline traces it (a context lookup otherwise).
func countTrip(ctx context.Context) {
	if n := tripsOf(ctx); n != nil {
		n.Add(1)
	}
}

// tripsOf is the round-trip counter of the traced transaction ctx belongs
// to, or nil.
func tripsOf(ctx context.Context) *atomic.Int64 {
	n, _ := ctx.Value(tripsKey{}).(*atomic.Int64)
	return n
}

// callTrace is a call's recording span, and when the call was queued.
type callTrace struct {
	span   trace.Span
	queued time.Time
}

// traceCall remembers the caller's span, when it records, for the
// transaction that will carry the call.
func (p *Pipeline) traceCall(ctx context.Context, c *pipeCall) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		c.traced = &callTrace{span: span, queued: time.Now()}
	}
}

// txTrace is one traced transaction.
type txTrace struct {
	span  trace.Span
	trips *atomic.Int64
	began time.Time
}

// startTx starts the span of a transaction about to decide batch, linked
// from each of the batch's recorded decisions, and returns the context
// its round trips are counted in.
func (p *Pipeline) startTx(batch []*pipeCall) (context.Context, *txTrace) {
	var links []trace.Link
	for _, c := range batch {
		if c.traced != nil {
			links = append(links, trace.Link{SpanContext: c.traced.span.SpanContext()})
		}
	}
	t := &txTrace{trips: &atomic.Int64{}, began: time.Now()}
	ctx := context.WithValue(context.Background(), tripsKey{}, t.trips)
	_, t.span = p.tracer.Start(ctx, SpanTransaction, trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(links...),
		trace.WithNewRoot(), trace.WithAttributes(attribute.String("db.system.name", "postgresql")))
	return ctx, t
}

// endTx ends a transaction's span with what it decided, and tells each of
// its recorded decisions which transaction carried it.
func (t *txTrace) end(batch []*pipeCall, err error) {
	if t.span.IsRecording() {
		tenants := map[string]struct{}{}
		var reserves, ends, expiries int
		count := func(it Item) {
			tenants[it.TenantID] = struct{}{}
			switch op := it.Op; {
			case op.Reserve != nil:
				reserves++
			case op.Expire != nil:
				expiries++
			default:
				ends++
			}
		}
		for _, c := range batch {
			if c.group == nil {
				count(c.item)
			}
			for _, it := range c.group {
				count(it)
			}
		}
		t.span.SetAttributes(AttrBatchSize.Int(len(batch)), AttrBatchTenants.Int(len(tenants)),
			AttrBatchRoundTrips.Int64(t.trips.Load()), AttrBatchReserves.Int(reserves), AttrBatchEnds.Int(ends),
			AttrBatchExpiries.Int(expiries))
		if err != nil {
			t.span.SetStatus(codes.Error, err.Error())
		}
	}
	t.span.End()
	link := trace.Link{SpanContext: t.span.SpanContext()}
	for _, c := range batch {
		if c.traced != nil {
			c.traced.span.AddLink(link)
			c.traced.span.SetAttributes(AttrBatchSize.Int(len(batch)),
				AttrQueuedMS.Float64(float64(t.began.Sub(c.traced.queued).Microseconds())/1000))
		}
	}
}
