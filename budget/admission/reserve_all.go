package admission

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// Decided is the decision on one request of a ReserveAll: its Reservation,
// or Err (its own refusal, a *rule.WithheldError when another request of
// the call was refused, or a failure of the whole call).
type Decided struct {
	Reservation *account.Reservation
	Err         error
}

// ReserveAll decides reqs as one decision, all or none: in one
// transaction of the store (account.Pipeline.ReserveAll), so that either
// every request is admitted, or none is debited and each that its own
// limits would have admitted is answered a *rule.WithheldError. Nothing
// is undone afterwards, because nothing moved. One request is Reserve.
//
// Requests of a group do not wait for tokens (MaxWait) and are not decided
// as end users. While the store is down, a group of several is answered
// rule.ErrUnavailable: this replica's share cannot admit every tenant of
// a group at once (outage.Local decides one request), so the group's
// failure policy is reject. Every outcome is counted like Reserve's:
// tokengate_admissions_total, by face, with outcome withheld for a
// request refused with its group.
func (a *Admitter) ReserveAll(ctx context.Context, reqs []Request) []Decided {
	if len(reqs) == 0 {
		return nil
	}
	out := make([]Decided, len(reqs))
	if len(reqs) == 1 {
		r, _, err := a.Reserve(ctx, reqs[0])
		out[0] = Decided{Reservation: r, Err: err}
		return out
	}
	spans := make([]trace.Span, len(reqs))
	ps := make([]account.ReserveParams, len(reqs))
	invalid := -1
	for i := range reqs {
		req := &reqs[i]
		if req.Start.IsZero() {
			req.Start = time.Now()
		}
		if a.tracer != nil {
			_, spans[i] = a.tracer.Start(ctx, SpanAdmission, trace.WithTimestamp(req.Start))
		}
		req.ReserveParams.Face = req.Face
		if err := req.prepare(); err != nil && invalid < 0 {
			invalid, out[i].Err = i, err
		}
		ps[i] = req.ReserveParams
		a.holdBack(&ps[i], a.pools.poolOf(ps[i]), nil, nil, "")
	}
	switch {
	case invalid >= 0:
		// One request the call cannot make: none is decided.
		for i := range out {
			if i != invalid {
				out[i].Err = &rule.WithheldError{}
			}
		}
	case a.Down():
		for i := range out {
			out[i].Err = rule.ErrUnavailable
		}
	default:
		for i, res := range a.pipeline.ReserveAll(ctx, ps) {
			out[i] = Decided{Reservation: res.Reservation, Err: res.Err}
		}
	}
	for i := range out {
		a.decidedOne(&ps[i], out[i].Reservation, out[i].Err)
		outcome, limit := a.count(ctx, reqs[i].Face, reqs[i].Start, out[i].Reservation, out[i].Err)
		a.metrics.path(reqs[i].Face, PathExact) // all or none: never leased
		if spans[i] != nil {
			spans[i].SetAttributes(AttrPath.String(PathExact))
			endAdmissionSpan(spans[i], &reqs[i], out[i].Reservation, false, outcome, limit, out[i].Err)
		}
	}
	if errs := errorsOf(out); errors.Is(errs, rule.ErrUnavailable) && !errors.Is(errs, rule.ErrOutcomeUnknown) {
		a.MarkDown(errs)
	}
	return out
}

// decidedOne learns what the store said of one request: its tenant's
// balances, its pool's counters, and what shadow limits would have
// refused.
func (a *Admitter) decidedOne(p *account.ReserveParams, r *account.Reservation, err error) {
	var rej *rule.RejectedError
	switch {
	case err == nil:
		a.remember(r.Snapshot)
		a.pools.learn(*p, r.Pool, r.Priority)
		if !r.Replayed {
			a.recordShadow(r.Shadow, r.Snapshot.At)
		}
	case errors.As(err, &rej):
		a.remember(rej.Snapshot)
		a.pools.learn(*p, rej.PoolState, rej.Priority)
		a.recordShadow(rej.Shadow, rej.Snapshot.At)
	}
}

// errorsOf is the first failure of a call that is not a request's own
// outcome (nil for none).
func errorsOf(out []Decided) error {
	for _, d := range out {
		if errors.Is(d.Err, rule.ErrUnavailable) {
			return d.Err
		}
	}
	return nil
}
