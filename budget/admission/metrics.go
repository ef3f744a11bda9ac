package admission

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// Face names the front door a request came through (rule.Face): the
// admission remembers it, and only it may end the admission. And for the
// metrics: every face counts its admissions here, once, so that a refusal
// through the proxy or the rate limit service moves the same counter, and
// the same dashboard tally and throttled alerts, as one through the HTTP
// API.
type Face = rule.Face

// The faces of a replica.
const (
	FaceAPI   = rule.FaceAPI
	FaceProxy = rule.FaceProxy
	FaceRLS   = rule.FaceRLS
)

// Outcomes of an admission, the values of tokengate_admissions_total's
// outcome label.
const (
	OutcomeAdmitted = "admitted"
	OutcomeReplayed = "replayed"
	OutcomeRejected = "rejected"
	OutcomeTooLarge = "too_large"
	OutcomeInvalid  = "invalid"
	// OutcomeUnauthorized: the decision found the credential revoked, the
	// tenant outside the gateway's scope, or the tenant disabled or gone.
	OutcomeUnauthorized = "unauthorized"
	OutcomeCancelled    = "cancelled"
	OutcomeError        = "error"
	// OutcomeWithheld: admitted by its own limits, not admitted because
	// another request of its call was refused (ReserveAll: all or none).
	OutcomeWithheld = "withheld"
)

// Outcomes of a settle or release, the values of
// tokengate_settlements_total's outcome label.
const (
	OutcomeApplied   = "applied"   // the balance moved
	OutcomeJournaled = "journaled" // the store was down: kept for the recovery loop
	OutcomeNotFound  = "not_found" // no such admission (or another tenant's)
	OutcomeConflict  = "conflict"  // ended already another way
	// OutcomeOtherFace: made through another face, the only one that may
	// end it (rule.ErrOtherFace).
	OutcomeOtherFace = "other_face"
	// OutcomeDeferred: named by key, no such admission yet, and kept for
	// the one a replica may have made on its own (account.ErrDeferred).
	OutcomeDeferred = "deferred"
)

// The kinds of ending of an admission.
const (
	kindSettle  = "settle"
	kindRelease = "release"
)

// metrics are the admission use case's own: decisions by face, outcome
// and refusing limit, their latency, settles and releases by face and
// outcome, and the estimate's error at settle.
type metrics struct {
	admissions *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	ends       *prometheus.CounterVec
	deltas     *prometheus.HistogramVec
	paths      *prometheus.CounterVec
	settles    *prometheus.CounterVec
	// traced: the latency carries exemplars (tracing is on).
	traced bool
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokengate_admissions_total",
			Help: "Admission decisions by face (api, proxy, rls), outcome (admitted, rejected, too_large, replayed, withheld, invalid, unauthorized, cancelled, error) and the limit that refused (model_scope: a model outside its key's or tenant's list).",
		}, []string{"face", "outcome", "limit"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tokengate_admission_duration_seconds",
			Help:    "Time to decide an admission, by face, estimation and waiting included.",
			Buckets: []float64{.0005, .001, .002, .004, .008, .016, .032, .064, .128, .256, .512, 1, 2, 4, 8, 16, 32},
		}, []string{"face"}),
		ends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokengate_settlements_total",
			Help: "Settles and releases by face (api, proxy, rls), kind (settle, release) and outcome (applied, replayed, journaled, not_found, deferred, conflict, invalid, cancelled, error).",
		}, []string{"face", "kind", "outcome"}),
		deltas: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tokengate_settle_delta_cost",
			Help:    "Estimate minus actual cost at settle (positive: over-estimated and refunded) or release.",
			Buckets: []float64{-10000, -1000, -100, -10, 0, 10, 100, 1000, 10000, 100000},
		}, []string{"kind"}),
	}
	m.paths = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tokengate_admission_paths_total",
		Help: "Admission decisions by face and the path that decided them: exact (the store's pipeline, under the tenant's row locks), lease (this replica's lease of the tenant, quota leasing) or local (the failure policy, without the store). A lease path only admits: a refusal is always decided exactly.",
	}, []string{"face", "path"})
	m.settles = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tokengate_settle_paths_total",
		Help: "Settles by face and the path that decided them: lease (in the journal of the lease this replica made the admission from, no tenant row locked), exact (the store's pipeline) or local (the failure policy's spool). Every settle is counted once, whatever its outcome.",
	}, []string{"face", "path"})
	reg.MustRegister(m.admissions, m.latency, m.ends, m.deltas, m.paths, m.settles)
	return m
}

// decided counts a decision and its latency. The latency carries the
// decision span's trace as an exemplar when ctx has a sampled one
// (exemplar.go): an operator goes from a slow bucket to its trace.
func (m *metrics) decided(ctx context.Context, face Face, outcome, limit string, start time.Time) {
	m.admissions.WithLabelValues(string(face), outcome, limit).Inc()
	observe(ctx, m.traced, m.latency.WithLabelValues(string(face)), time.Since(start).Seconds())
}

// Invalid counts a request its face refused before it could be decided (a
// body that does not parse, a bad idempotency key): such a request is an
// admission attempt too, whatever the face.
func (a *Admitter) Invalid(face Face, start time.Time) {
	a.metrics.decided(context.Background(), face, OutcomeInvalid, "", start)
}

// count records one Reserve's outcome: the metric, and a rejection in the
// dashboard's tally (which the throttled alerts read), whichever face
// asked. It returns the outcome and the refusing limit, for the span.
func (a *Admitter) count(ctx context.Context, face Face, start time.Time, r *account.Reservation, err error) (outcome, limit string) {
	var rej *rule.RejectedError
	var tl *rule.TooLargeError
	switch {
	case err == nil && r.Replayed:
		outcome = OutcomeReplayed
	case err == nil:
		outcome = OutcomeAdmitted
	case errors.As(err, &rej):
		outcome, limit = OutcomeRejected, string(rej.Limit)
		if a.cfg.Rejections != nil {
			a.cfg.Rejections.Add(rej)
		}
	case errors.As(err, &tl):
		outcome, limit = OutcomeTooLarge, string(tl.Limit)
	case errors.Is(err, rule.ErrWithheld):
		outcome = OutcomeWithheld
	case errors.Is(err, rule.ErrEndUserCap):
		outcome, limit = OutcomeRejected, "end_user_cap"
	case errors.Is(err, rule.ErrModelNotAllowed):
		outcome, limit = OutcomeRejected, string(rule.LimitModelScope)
	case errors.Is(err, rule.ErrKeyRevoked), errors.Is(err, rule.ErrGatewayRevoked), errors.Is(err, rule.ErrOutOfScope),
		errors.Is(err, rule.ErrTenantDisabled), errors.Is(err, rule.ErrTenantNotFound):
		outcome = OutcomeUnauthorized
	case ctx.Err() != nil:
		outcome = OutcomeCancelled
	case isInvalid(err):
		outcome = OutcomeInvalid
	default:
		outcome = OutcomeError
	}
	a.metrics.decided(ctx, face, outcome, limit, start)
	return outcome, limit
}

// isInvalid tells a request refused by policy as the caller's mistake from
// an error of the replica or its store (OutcomeError, which alerts read as
// an outage): a value the store cannot hold, a field the decision refused
// (a model without a price where a money window counts it, an end-user
// id), an estimate's field, usage or amounts out of range, an
// Idempotency-Key reused for another request.
func isInvalid(err error) bool {
	var binv *rule.InvalidError
	var einv *estimator.InvalidError
	var lim *rule.LimitError
	return account.IsInvalidInput(err) || errors.As(err, &binv) || errors.As(err, &einv) || errors.As(err, &lim) ||
		errors.Is(err, rule.ErrUsageOutOfBounds) || errors.Is(err, rule.ErrOverflow) || errors.Is(err, rule.ErrIdempotencyMismatch)
}

// ended records one settle's or release's outcome, whichever face asked,
// and the estimate's error of one that moved the balance (a replay moves
// nothing and is not counted again). It returns the outcome, for the span.
func (m *metrics) ended(ctx context.Context, face Face, kind string, st *account.Settlement, journaled bool, err error) string {
	outcome := m.outcomeOf(ctx, st, journaled, err)
	if outcome == OutcomeApplied && st.Admission != nil && st.Admission.ActualCost != nil {
		m.deltas.WithLabelValues(kind).Observe(float64(st.Admission.Estimate.Cost - *st.Admission.ActualCost))
	}
	m.ends.WithLabelValues(string(face), kind, outcome).Inc()
	return outcome
}

// outcomeOf is the outcome of a settle or release.
func (m *metrics) outcomeOf(ctx context.Context, st *account.Settlement, journaled bool, err error) string {
	switch {
	case err == nil && journaled:
		return OutcomeJournaled
	case err == nil && st.Replayed:
		return OutcomeReplayed
	case err == nil:
		return OutcomeApplied
	case errors.Is(err, account.ErrDeferred):
		return OutcomeDeferred
	case errors.Is(err, rule.ErrAdmissionNotFound):
		return OutcomeNotFound
	case errors.Is(err, rule.ErrConflict):
		return OutcomeConflict
	case errors.Is(err, rule.ErrOtherFace):
		return OutcomeOtherFace
	case ctx.Err() != nil:
		return OutcomeCancelled
	case isInvalid(err):
		return OutcomeInvalid
	}
	return OutcomeError
}

// Settlements is the counter of one face's settles (kind "settle") or
// releases ("release") with an outcome, for tests and the faces' reports.
func (a *Admitter) Settlements(face Face, kind, outcome string) prometheus.Counter {
	return a.metrics.ends.WithLabelValues(string(face), kind, outcome)
}

// Admissions is the counter of one face's outcome and refusing limit ("" for
// none), for tests and for the faces' own reports.
func (a *Admitter) Admissions(face Face, outcome, limit string) prometheus.Counter {
	return a.metrics.admissions.WithLabelValues(string(face), outcome, limit)
}

// path counts the path that decided one Reserve (tokengate_admission_paths_total).
func (m *metrics) path(face Face, path string) {
	m.paths.WithLabelValues(string(face), path).Inc()
}

// settlePath counts the path that decided one Settle
// (tokengate_settle_paths_total).
func (m *metrics) settlePath(face Face, path string) {
	m.settles.WithLabelValues(string(face), path).Inc()
}

// SettlePaths is the counter of one face's settles decided by a path, for
// tests and the faces' reports.
func (a *Admitter) SettlePaths(face Face, path string) prometheus.Counter {
	return a.metrics.settles.WithLabelValues(string(face), path)
}

// Paths is the counter of one face's decisions made by a path (PathExact,
// PathLease, PathLocal), for tests and the faces' reports.
func (a *Admitter) Paths(face Face, path string) prometheus.Counter {
	return a.metrics.paths.WithLabelValues(string(face), path)
}
