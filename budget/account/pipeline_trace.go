package account

import (
	"context"
	"sync/atomic"
)

// PipelineTracer follows a pipeline's transactions (PipelineConfig.Tracer),
// so that each can be traced, and each decision it carried linked to it.
// The domain imports no tracing library: budget/admission implements it
// over OpenTelemetry.
type PipelineTracer interface {
	// Call is told of a call as it joins its queue, with the caller's
	// context. It returns what Begin is given for the call, or nil when
	// the call is not traced (its caller records no span).
	Call(ctx context.Context) TracedCall
	// Begin is told that a transaction begins, carrying calls (the non-nil
	// values Call returned, in the batch's order).
	Begin(calls []TracedCall) TracedTx
}

// TracedCall is a traced call, as the PipelineTracer that traced it knows
// it.
type TracedCall any

// TracedTx is a traced transaction: End is told what it decided, once.
type TracedTx interface {
	End(f BatchFigures, err error)
}

// BatchFigures are what a transaction decided: how many calls, for how many
// tenants, in how many round trips, and of which kinds.
type BatchFigures struct {
	Size, Tenants            int
	RoundTrips               int64
	Reserves, Ends, Expiries int
}

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

// txTrace is one traced transaction, and the counter of its round trips.
type txTrace struct {
	traced TracedTx
	trips  *atomic.Int64
}

// startTx tells the tracer a transaction about to decide batch begins, and
// returns the context its round trips are counted in.
func (p *Pipeline) startTx(batch []*pipeCall) (context.Context, *txTrace) {
	var calls []TracedCall
	for _, c := range batch {
		if c.traced != nil {
			calls = append(calls, c.traced)
		}
	}
	t := &txTrace{trips: &atomic.Int64{}}
	ctx := context.WithValue(context.Background(), tripsKey{}, t.trips)
	t.traced = p.tracer.Begin(calls)
	return ctx, t
}

// end tells the tracer what the transaction decided.
func (t *txTrace) end(batch []*pipeCall, err error) {
	f := BatchFigures{Size: len(batch), RoundTrips: t.trips.Load()}
	tenants := map[string]struct{}{}
	count := func(it Item) {
		tenants[it.TenantID] = struct{}{}
		switch op := it.Op; {
		case op.Reserve != nil:
			f.Reserves++
		case op.Expire != nil:
			f.Expiries++
		default:
			f.Ends++
		}
	}
	for _, c := range batch {
		if c.group == nil {
			count(c.item)
		}
		for _, it := range c.group { // a ReserveAll's
			count(it)
		}
	}
	f.Tenants = len(tenants)
	t.traced.End(f, err)
}
