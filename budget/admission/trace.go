package admission

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// Decision spans (Config.TracerProvider): one for each admission, settle,
// release and expiry, whatever the face, started here so that every face
// traces the same decisions with the same attributes. A face only puts its
// caller's trace context in ctx; the span is then a child of the caller's
// span. The pipeline transaction that decided it (SpanTransaction)
// is linked from it.
//
// Off (no provider), none of this runs: each entry point checks one nil
// tracer before it builds anything.
const (
	SpanAdmission = "tokengate.admission"
	SpanSettle    = "tokengate.settle"
	SpanRelease   = "tokengate.release"
	SpanExpire    = "tokengate.expire"

	// TracerName is the instrumentation scope of the admission layer's
	// spans.
	TracerName = "github.com/tokengate/tokengate/budget/admission"
)

// The attributes of a decision span.
const (
	AttrFace        = attribute.Key("tokengate.face")
	AttrTenant      = attribute.Key("tokengate.tenant")
	AttrDecidedFor  = attribute.Key("tokengate.decided_for") // the end user's tenant a request was decided as
	AttrLevel       = attribute.Key("tokengate.level")       // the tenant of a budget tree whose limit refused
	AttrModel       = attribute.Key("tokengate.model")
	AttrAdmissionID = attribute.Key("tokengate.admission_id")
	AttrOutcome     = attribute.Key("tokengate.outcome")
	AttrLimit       = attribute.Key("tokengate.limit") // the limit that refused
	AttrDecidedBy   = attribute.Key("tokengate.decided_by")
	AttrEstInput    = attribute.Key("tokengate.estimate.input_tokens")
	AttrEstOutput   = attribute.Key("tokengate.estimate.output_tokens")
	AttrEstCost     = attribute.Key("tokengate.estimate.cost")
	AttrActInput    = attribute.Key("tokengate.actual.input_tokens")
	AttrActOutput   = attribute.Key("tokengate.actual.output_tokens")
	AttrActCost     = attribute.Key("tokengate.actual.cost")
	AttrDelta       = attribute.Key("tokengate.balance_delta") // the change of the balance at the end, in cost units
	AttrMoneyEst    = attribute.Key("tokengate.money.estimate_micro")
	AttrMoneyAct    = attribute.Key("tokengate.money.actual_micro")
	AttrRetryAfter  = attribute.Key("tokengate.retry_after_ms")
	AttrWaitedMS    = attribute.Key("tokengate.waited_ms") // time spent waiting for tokens (max_wait_ms)
	AttrWaits       = attribute.Key("tokengate.waits")     // how many times it waited
	AttrExpired     = attribute.Key("tokengate.expired")   // reservations an expiry ended
)

// Who decided: the store (Postgres, the pipeline) or this replica alone
// under the local failure policy (journaled for the recovery loop).
const (
	DecidedByStore = "store"
	DecidedByLocal = "local"
)

// tracing is the admission layer's tracer: nil when tracing is off.
func newTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(TracerName)
}

// endAdmissionSpan records a Reserve's outcome on its span and ends it.
func endAdmissionSpan(span trace.Span, req *Request, r *account.Reservation, local bool, outcome, limit string, err error) {
	if span.IsRecording() {
		attrs := make([]attribute.KeyValue, 0, 14)
		attrs = append(attrs, AttrFace.String(string(req.Face)), AttrTenant.String(req.TenantID), AttrOutcome.String(outcome),
			AttrModel.String(req.Estimate.Model), AttrEstInput.Int64(req.Estimate.InputTokens),
			AttrEstOutput.Int64(req.Estimate.OutputTokens), AttrEstCost.Int64(req.Estimate.Cost))
		if limit != "" {
			attrs = append(attrs, AttrLimit.String(limit))
		}
		var rej *rule.RejectedError
		var tl *rule.TooLargeError
		switch {
		case r != nil:
			attrs = append(attrs, AttrAdmissionID.String(r.AdmissionID), decidedBy(local))
			if r.Snapshot.TenantID != "" && r.Snapshot.TenantID != req.TenantID {
				attrs = append(attrs, AttrDecidedFor.String(r.Snapshot.TenantID))
			}
		case errors.As(err, &rej):
			attrs = append(attrs, AttrLevel.String(levelOr(rej.Level, rej.Snapshot.TenantID, req.TenantID)),
				AttrRetryAfter.Int64(rule.RetryAfterMillis(rej.RetryAfter)), decidedBy(local))
		case errors.As(err, &tl):
			attrs = append(attrs, AttrLevel.String(levelOr(tl.Level, "", req.TenantID)), decidedBy(local))
		}
		span.SetAttributes(attrs...)
		if outcome == OutcomeError {
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}

func levelOr(level, snap, tenant string) string {
	switch {
	case level != "":
		return level
	case snap != "":
		return snap
	}
	return tenant
}

func decidedBy(local bool) attribute.KeyValue {
	if local {
		return AttrDecidedBy.String(DecidedByLocal)
	}
	return AttrDecidedBy.String(DecidedByStore)
}

// endSettleSpan records a settle's or release's outcome on its span and
// ends it.
func endSettleSpan(span trace.Span, face Face, tenantID, admissionID string, st *account.Settlement, journaled bool, outcome string, err error) {
	if span.IsRecording() {
		attrs := make([]attribute.KeyValue, 0, 14)
		attrs = append(attrs, AttrFace.String(string(face)), AttrTenant.String(tenantID), AttrOutcome.String(outcome))
		if admissionID != "" {
			attrs = append(attrs, AttrAdmissionID.String(admissionID))
		}
		switch {
		case journaled:
			attrs = append(attrs, decidedBy(true))
		case err == nil && st != nil:
			attrs = append(attrs, decidedBy(false), AttrDelta.Float64(float64(st.DeltaMicro)/float64(rule.Micro)))
			if ad := st.Admission; ad != nil {
				if admissionID == "" { // named by idempotency key
					attrs = append(attrs, AttrAdmissionID.String(ad.ID))
				}
				attrs = append(attrs, AttrModel.String(ad.Estimate.Model),
					AttrEstInput.Int64(ad.Estimate.InputTokens), AttrEstOutput.Int64(ad.Estimate.OutputTokens),
					AttrEstCost.Int64(ad.Estimate.Cost))
				if ad.ActualInput != nil {
					attrs = append(attrs, AttrActInput.Int64(*ad.ActualInput))
				}
				if ad.ActualOutput != nil {
					attrs = append(attrs, AttrActOutput.Int64(*ad.ActualOutput))
				}
				if ad.ActualCost != nil {
					attrs = append(attrs, AttrActCost.Int64(*ad.ActualCost))
				}
				if ad.MoneyEstimate != nil {
					attrs = append(attrs, AttrMoneyEst.Int64(*ad.MoneyEstimate))
				}
				if ad.MoneyActual != nil {
					attrs = append(attrs, AttrMoneyAct.Int64(*ad.MoneyActual))
				}
			}
		}
		span.SetAttributes(attrs...)
		if outcome == OutcomeError {
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}

// expireTraced is the pipeline's expiry, each tenant's in a span.
func (a *Admitter) expireTraced(ctx context.Context, tenantID string) (int, error) {
	ctx, span := a.tracer.Start(ctx, SpanExpire)
	n, err := a.pipeline.Expire(ctx, tenantID)
	if span.IsRecording() {
		outcome := OutcomeApplied
		if err != nil {
			outcome = OutcomeError
			span.SetStatus(codes.Error, err.Error())
		}
		span.SetAttributes(AttrFace.String("sweep"), AttrTenant.String(tenantID), AttrOutcome.String(outcome),
			AttrExpired.Int(n), decidedBy(false))
	}
	span.End()
	return n, err
}

// noteWaited records on the decision span in ctx how long the caller
// waited for tokens, and how many times.
func noteWaited(ctx context.Context, waited time.Duration, waits int) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(AttrWaitedMS.Float64(float64(waited.Microseconds())/1000), AttrWaits.Int(waits))
	}
}

// observe observes v, with the sampled trace of ctx as its exemplar when
// traced is true: Prometheus keeps one exemplar per bucket, served in the
// OpenMetrics format.
func observe(ctx context.Context, traced bool, o prometheus.Observer, v float64) {
	if traced {
		if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
			if eo, ok := o.(prometheus.ExemplarObserver); ok {
				eo.ObserveWithExemplar(v, prometheus.Labels{"trace_id": sc.TraceID().String(), "span_id": sc.SpanID().String()})
				return
			}
		}
	}
	o.Observe(v)
}
