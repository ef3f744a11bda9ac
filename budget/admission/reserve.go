package admission

import (
	"context"
	"crypto/sha256"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// Request is one admission to decide.
type Request struct {
	account.ReserveParams
	// MaxWait is how long the caller will wait for tokens instead of a
	// rejection (capped by the tenant's max_wait).
	MaxWait time.Duration
	// Face is the front door the request came through: the admission's
	// owner (ReserveParams.Face is set from it: "" is the API), and the
	// metrics' label.
	Face Face
	// Start is when the face took the request, so that the latency
	// counts its estimation; zero means when Reserve was called.
	Start time.Time
	// Body is the request as its face received it (an HTTP body; for the
	// rate limit service, the descriptor that names the request). With an
	// IdempotencyKey and no RequestHash, its SHA-256 is the request's
	// fingerprint: a retry with the same key and body is answered with the
	// first admission, the key with another body is a mismatch.
	Body []byte
	// EndUser is what may name the caller's end user: when the tenant has
	// an end-user policy and the request gives an id from its source, the
	// request is decided as that end user (a leaf budget below the tenant,
	// with the tenant's key), and Reservation.Snapshot.TenantID is the end
	// user's tenant id, which its settle or release names.
	EndUser EndUser
}

// prepare applies the rules every face's request follows before it is
// decided: the idempotency key's form, and the request's fingerprint.
func (r *Request) prepare() error {
	if r.IdempotencyKey == "" {
		return nil
	}
	if problem := rule.IdempotencyKeyProblem(r.IdempotencyKey); problem != "" {
		return &rule.InvalidError{Field: "Idempotency-Key", Reason: problem}
	}
	if r.RequestHash == nil {
		h := sha256.Sum256(r.Body)
		r.RequestHash = h[:]
	}
	return nil
}

// Reserve decides a request through the store, or, when the store does not
// answer and the request's policy is local, against this replica's share
// (local is then true). It returns what account.Store.Reserve returns, and
// rule.ErrUnavailable, ErrOutcomeUnknown or ErrBusy.
//
// Every outcome is counted here, by face: tokengate_admissions_total, and a
// rejection in the dashboard's tally, which the throttled alerts read.
func (a *Admitter) Reserve(ctx context.Context, req Request) (*account.Reservation, bool, error) {
	start := req.Start
	if start.IsZero() {
		start = time.Now()
	}
	var span trace.Span
	if a.tracer != nil {
		ctx, span = a.tracer.Start(ctx, SpanAdmission, trace.WithTimestamp(start))
	}
	req.ReserveParams.Face = req.Face // the face that called, whatever the params say
	if err := req.prepare(); err != nil {
		a.Invalid(req.Face, start)
		if span != nil {
			endAdmissionSpan(span, &req, nil, false, OutcomeInvalid, "", err)
		}
		return nil, false, err
	}
	r, local, asEndUser, err := a.reserveEndUser(ctx, req)
	leased := false
	if !asEndUser {
		// The tenant's own request (an end user's is always exact).
		if r, leased, err = a.reserveLeased(ctx, &req); !leased && err == nil {
			r, local, err = a.reserve(ctx, req)
		}
	}
	if inv := (*rule.InvalidError)(nil); asEndUser && errors.As(err, &inv) {
		a.Invalid(req.Face, start) // the end-user id
		if span != nil {
			endAdmissionSpan(span, &req, nil, false, OutcomeInvalid, "", err)
		}
		return nil, false, err
	}
	outcome, limit := a.count(ctx, req.Face, start, r, err)
	path := pathOf(leased, local)
	a.metrics.path(req.Face, path)
	if span != nil {
		span.SetAttributes(AttrPath.String(path))
		endAdmissionSpan(span, &req, r, local, outcome, limit, err)
	}
	return r, local, err
}

func (a *Admitter) reserve(ctx context.Context, req Request) (r *account.Reservation, local bool, err error) {
	p := req.ReserveParams
	if !a.Down() {
		r, err = a.reserveWaiting(ctx, p, req.MaxWait)
		if err == nil {
			a.remember(r.Snapshot)
			if !r.Replayed {
				a.recordShadow(r.Shadow, r.Snapshot.At)
			}
			return r, false, nil
		}
		var rej *rule.RejectedError
		if errors.As(err, &rej) {
			a.remember(rej.Snapshot)
			a.recordShadow(rej.Shadow, rej.Snapshot.At)
		}
		if !errors.Is(err, rule.ErrUnavailable) || errors.Is(err, rule.ErrOutcomeUnknown) {
			return nil, false, err
		}
		a.MarkDown(err)
	} else {
		err = rule.ErrUnavailable
	}
	if a.policy(p.Estimate.Family, p.TenantID) != rule.PolicyLocal || a.cfg.Local == nil {
		return nil, false, err
	}
	snap, ok := a.LastSnapshot(p.TenantID)
	if !ok {
		return nil, false, err // this replica never saw the tenant: it has no limits to apply
	}
	if len(snap.Path) > 0 {
		// A nested budget: this replica's share of the tenant alone cannot
		// bound what its organisation spends across every replica and
		// sibling, and overspending a parent is the failure tokengate
		// exists to prevent. The store decides, or no one does.
		return nil, false, err
	}
	// The tenant's model scope as this replica last saw it; a key's scope
	// is read only by the store's decision, so a key narrower than its
	// tenant is not applied while the store is down.
	if err := rule.CheckModelScopes(p.Estimate.Model, "model", []rule.ScopeLevel{{TenantID: snap.TenantID, Models: snap.Models}}, nil); err != nil {
		return nil, true, err
	}
	r, err = a.cfg.Local.Reserve(snap, p)
	return r, true, err
}

// recordShadow counts what shadow limits would have refused of one
// request, from the decision that answered it (a caller that waited is
// counted once, like a rejection), so the count is what enforcing the
// limits would have refused.
func (a *Admitter) recordShadow(shadow []rule.ShadowRefusal, at time.Time) {
	for _, sr := range shadow {
		a.shadow.WithLabelValues(string(sr.Limit)).Inc()
		if a.cfg.Rejections != nil {
			a.cfg.Rejections.AddShadow(sr.Level, at, sr.Limit)
		}
	}
}
