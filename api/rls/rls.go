// Package rls is tokengate's face for Envoy: the rate limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) that
// Envoy's ratelimit filter, Envoy Gateway and Envoy AI Gateway call. A
// call's descriptors name the tenant, the model and the request; its hits
// are the cost. The first call of a request reserves, and the call Envoy
// sends at stream end (a descriptor entry phase=response, with the actual
// usage as hits) settles that reservation, so the gateway keeps every
// guarantee of the HTTP API: one tenant-wide allowance whatever the number
// of replicas, reservations that settle or expire, and a ledger entry for
// each.
//
// It is a face: it may import the domain (budget and the packages below
// it, estimator), never another face.
package rls

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokengate/tokengate/budget"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// The descriptor entries a call may carry.
const (
	EntryTenant    = "tenant"     // required: the tenant asked for
	EntryModel     = "model"      // the model (its failure policy applies)
	EntryRequestID = "request_id" // ties the stream-end call to the reservation
	EntryPhase     = "phase"      // "request" (default: reserve) or "response" (settle)
)

// maxHits bounds the cost of one descriptor.
const maxHits = 1_000_000_000

// Server implements RateLimitServiceServer.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	admitter  *admission.Admitter
	guard     *credential.Guard
	estimator *estimator.Estimator // resolves model families (their failure policy)
	logger    *slog.Logger
	tracing   *replica.Tracing // nil or off: no trace context is read
	calls     *prometheus.CounterVec
	refused   *prometheus.CounterVec
}

// New returns a Server on the replica's services; its metrics join the
// replica's registry.
func New(rep *replica.Replica) *Server {
	s := &Server{
		admitter: rep.Admitter, guard: rep.Guard, estimator: rep.Estimator, logger: rep.Logger, tracing: rep.Tracing,
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokengate_rls_calls_total",
			Help: "ShouldRateLimit calls by phase (request, response) and outcome (ok, over_limit, error).",
		}, []string{"phase", "outcome"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokengate_rls_refused_total",
			Help: "ShouldRateLimit calls answered OVER_LIMIT without a decision: unauthenticated, or naming a tenant outside the gateway's scope.",
		}, []string{"reason"}),
	}
	rep.Registry.MustRegister(s.calls, s.refused)
	return s
}

// Refused is the count of calls refused without a decision for reason
// (unauthenticated, out_of_scope, throttled, tenant_unknown_or_disabled).
func (s *Server) Refused(reason string) prometheus.Counter { return s.refused.WithLabelValues(reason) }

// descriptor is one descriptor of a call, read.
type descriptor struct {
	tenant, model, requestID string
	response                 bool
	negative                 bool
	hits                     int64
}

func parse(req *rlsv3.RateLimitRequest) ([]descriptor, error) {
	if len(req.Descriptors) == 0 {
		return nil, errors.New("a call needs at least one descriptor")
	}
	if err := checkEntries(req); err != nil {
		return nil, err
	}
	var out []descriptor
	for i, d := range req.Descriptors {
		var x descriptor
		for _, e := range d.GetEntries() {
			switch e.GetKey() {
			case EntryTenant:
				x.tenant = e.GetValue()
			case EntryModel:
				x.model = e.GetValue()
			case EntryRequestID:
				x.requestID = e.GetValue()
			case EntryPhase:
				switch e.GetValue() {
				case "request":
				case "response":
					x.response = true
				default:
					return nil, errors.New("descriptor " + strconv.Itoa(i) + ": phase must be request or response")
				}
			}
		}
		if x.tenant == "" {
			return nil, errors.New("descriptor " + strconv.Itoa(i) + ": a " + EntryTenant + " entry is required")
		}
		if x.response && x.requestID == "" {
			return nil, errors.New("descriptor " + strconv.Itoa(i) + ": phase=response needs a " + EntryRequestID + " entry")
		}
		if x.requestID != "" {
			// It keys the reservation: the domain's rule for idempotency
			// keys, leaving room for the face's prefix.
			if problem := rule.IdempotencyKeyProblem(key(x.requestID)); problem != "" {
				return nil, errors.New("descriptor " + strconv.Itoa(i) + ": " + EntryRequestID + " " + problem + " (" + strconv.Itoa(rule.MaxIdempotencyKey-len(key(""))) + " at most)")
			}
		}
		if len(x.model) > 256 {
			return nil, errors.New("descriptor " + strconv.Itoa(i) + ": model too long")
		}
		// Hits: the descriptor's own, else the call's; an unset call
		// value means 1, as for Envoy's own service.
		x.hits = int64(req.GetHitsAddend())
		if h := d.GetHitsAddend(); h != nil {
			x.hits = int64(min(h.GetValue(), uint64(math.MaxInt64)))
		} else if x.hits == 0 {
			x.hits = 1
		}
		if x.hits > maxHits {
			return nil, errors.New("descriptor " + strconv.Itoa(i) + ": hits above 1000000000")
		}
		x.negative = d.GetIsNegativeHits()
		out = append(out, x)
	}
	return out, nil
}

// gatewayOf authenticates the caller from its "authorization: Bearer
// tgw_..." metadata.
func (s *Server) gatewayOf(ctx context.Context) (credential.Gateway, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	var presented string
	for _, v := range md.Get("authorization") {
		if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
			presented = strings.TrimSpace(v[7:])
		}
	}
	addr := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
		if i := strings.LastIndexByte(addr, ':'); i > 0 {
			addr = addr[:i]
		}
	}
	// A credential verified lately is answered from memory: the decision
	// checks in its own transaction that it was not revoked since.
	return s.guard.GatewayDeferred(ctx, addr, presented)
}

// ShouldRateLimit decides a gateway's call: OK (admitted, or settled) or
// OVER_LIMIT (refused: nothing debited). A caller that is not an
// authenticated gateway scoped to the tenant gets OVER_LIMIT with no
// decision. A store failure is a gRPC Unavailable error, so Envoy applies
// its failure_mode_deny.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if s.tracing.On() {
		// The caller's trace (Envoy's traceparent metadata): each
		// decision's span is a child of its span.
		md, _ := metadata.FromIncomingContext(ctx)
		ctx = s.tracing.Extract(ctx, metadataCarrier(md))
	}
	ds, err := parse(req)
	if err != nil {
		s.calls.WithLabelValues("request", "error").Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	gw, err := s.gatewayOf(ctx)
	var throttled *credential.ThrottledError
	switch {
	case errors.As(err, &throttled):
		s.refused.WithLabelValues("throttled").Inc()
		return overLimit(len(ds), throttled.RetryAfter), nil
	case errors.Is(err, credential.ErrGatewayInvalid):
		s.refused.WithLabelValues("unauthenticated").Inc()
		return overLimit(len(ds), time.Second), nil
	case err != nil:
		return nil, status.Error(codes.Unavailable, "the store cannot authenticate the gateway now")
	}
	for _, d := range ds {
		if !gw.May(d.tenant) {
			s.refused.WithLabelValues("out_of_scope").Inc()
			return overLimit(len(ds), time.Second), nil
		}
	}

	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	var admitted []admittedAt // to release if a later descriptor is refused
	var last *rule.Snapshot
	var exhausted *rule.BudgetExhaustedError // the first descriptor refused by an exhausted window
	for _, d := range ds {
		phase := "request"
		if d.response || d.negative {
			phase = "response"
		}
		st, snap, rej, err := s.decide(ctx, gw, d)
		if err != nil {
			v := verdictOf(err)
			if v.code == codes.OK {
				// Denied like a refusal, with nothing decided.
				s.calls.WithLabelValues(phase, "over_limit").Inc()
				s.refused.WithLabelValues(v.reason).Inc()
				resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
				resp.Statuses = append(resp.Statuses, statusOf(&rule.RejectedError{RetryAfter: time.Second}, nil, nil))
				continue
			}
			s.calls.WithLabelValues(phase, "error").Inc()
			s.releaseAll(ctx, gw, admitted)
			return nil, status.Error(v.code, v.message)
		}
		switch {
		case rej != nil:
			s.calls.WithLabelValues(phase, "over_limit").Inc()
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		default:
			s.calls.WithLabelValues(phase, "ok").Inc()
			if st.admissionID != "" {
				admitted = append(admitted, admittedAt{tenant: d.tenant, id: st.admissionID})
			}
		}
		if snap != nil {
			last = snap
		}
		if st.exhausted != nil && exhausted == nil {
			exhausted = st.exhausted
		}
		resp.Statuses = append(resp.Statuses, statusOf(rej, snap, st.exhausted))
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		// A refusal consumes nothing: what this call reserved for its other
		// descriptors is released.
		s.releaseAll(ctx, gw, admitted)
	}
	if last != nil {
		resp.ResponseHeadersToAdd = headers(*last, resp)
	}
	if exhausted != nil {
		exhaustedResponse(resp, exhausted)
	}
	return resp, nil
}

// verdict is how the service answers a descriptor the domain did not
// decide: a gRPC error, or (code OK) OVER_LIMIT with nothing decided,
// counted by reason.
type verdict struct {
	code    codes.Code
	reason  string // tokengate_rls_refused_total's, when code is OK
	message string
}

// verdictOf is the service's one table from the domain's errors to its
// answers. A refusal by a limit is not an error (decide returns it as a
// *rule.RejectedError beside a nil error).
func verdictOf(err error) verdict {
	var tl *rule.TooLargeError
	var inv *rule.InvalidError
	switch {
	case errors.Is(err, rule.ErrTenantNotFound), errors.Is(err, rule.ErrTenantDisabled):
		return verdict{code: codes.OK, reason: "tenant_unknown_or_disabled"}
	case errors.Is(err, rule.ErrGatewayRevoked):
		// Revoked since this replica verified it: found by the decision.
		return verdict{code: codes.OK, reason: "unauthenticated"}
	case errors.Is(err, rule.ErrOutOfScope):
		return verdict{code: codes.OK, reason: "out_of_scope"}
	case errors.Is(err, rule.ErrOtherFace):
		// An admission another face made: not the gateway's to end (its
		// keys live in its own namespace, so a stream end never names one).
		return verdict{code: codes.PermissionDenied, message: err.Error()}
	case errors.Is(err, budget.ErrEndUserCap):
		return verdict{code: codes.OK, reason: "end_user_cap"}
	case errors.As(err, &tl), errors.As(err, &inv), errors.Is(err, rule.ErrIdempotencyMismatch),
		errors.Is(err, rule.ErrUsageOutOfBounds), errors.Is(err, rule.ErrOverflow):
		// The caller's own mistake (usage no request could produce, for
		// one): nothing moved, and retrying will not help.
		return verdict{code: codes.InvalidArgument, message: err.Error()}
	case budget.IsInvalidInput(err):
		// The store refused a value the call sent: the caller's error,
		// never an outage (and no raw database message).
		return verdict{code: codes.InvalidArgument, message: "a descriptor value cannot be stored (a NUL character, a character outside UTF-8, or too long)"}
	}
	// The store cannot decide now: Envoy applies its failure_mode_deny.
	return verdict{code: codes.Unavailable, message: err.Error()}
}

type admittedAt struct{ tenant, id string }

// decided is a descriptor's decision: the admission it made, or the
// exhausted budget window that refused it (beside its *RejectedError).
type decided struct {
	admissionID string
	exhausted   *rule.BudgetExhaustedError
}

func (s *Server) decide(ctx context.Context, gw credential.Gateway, d descriptor) (decided, *rule.Snapshot, *rule.RejectedError, error) {
	actor := "gateway:" + gw.Name
	if d.response || d.negative {
		// The stream-end call (or a refund): settle the request's
		// reservation with what it actually used.
		if d.requestID == "" {
			return decided{}, nil, nil, nil // nothing names a reservation: nothing to correct
		}
		// Found by its request id inside the decision's transaction, which
		// also checks the gateway: no lookup beside the pipeline.
		// Its model, if the call names it, is the request's failure policy:
		// a settle that comes before a local admission's replay is kept.
		p := budget.SettleParams{TenantID: d.tenant, IdempotencyKey: key(d.requestID), InputTokens: d.hits, Actor: actor, GatewayID: gw.ID,
			Family: s.family(d.model)}
		if d.negative {
			p.InputTokens, p.RefundTokens = 0, d.hits
		}
		st, _, err := s.admitter.Settle(ctx, admission.FaceRLS, p)
		switch {
		case errors.Is(err, rule.ErrAdmissionNotFound):
			// Its reservation was refused, or is older than 24 h; or it was
			// admitted by a replica on its own and is not replayed yet, and
			// the settle is kept for it (budget.ErrDeferred).
			return decided{}, nil, nil, nil
		case errors.Is(err, rule.ErrConflict):
			return decided{}, nil, nil, nil // settled already with other usage: the first answer stands
		case err != nil:
			return decided{}, nil, nil, err
		}
		if st == nil {
			return decided{}, nil, nil, nil // journaled during an outage
		}
		return decided{}, &st.Snapshot, nil, nil
	}
	p := budget.ReserveParams{TenantID: d.tenant, Actor: actor, GatewayID: gw.ID,
		Estimate: estimator.Estimate{Model: d.model, Family: s.family(d.model), InputTokens: d.hits, Cost: d.hits,
			InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}
	if d.requestID != "" {
		// The request id keys the reservation: Envoy retrying the call
		// gets the same one, and the stream-end call finds it.
		p.IdempotencyKey = key(d.requestID)
		// A retry is answered OK with the balances now: no answer kept.
		p.ReplayNow = true
	}
	// The descriptor is the request: Envoy retrying it sends the same one.
	body := []byte(d.tenant + "\x00" + d.requestID + "\x00" + strconv.FormatInt(d.hits, 10))
	r, _, err := s.admitter.Reserve(ctx, admission.Request{ReserveParams: p, Face: admission.FaceRLS, Body: body})
	var rej *rule.RejectedError
	if errors.As(err, &rej) {
		var exh *rule.BudgetExhaustedError
		errors.As(err, &exh)
		return decided{exhausted: exh}, &rej.Snapshot, rej, nil
	}
	if err != nil {
		return decided{}, nil, nil, err
	}
	return decided{admissionID: r.AdmissionID}, &r.Snapshot, nil, nil
}

func (s *Server) releaseAll(ctx context.Context, gw credential.Gateway, admitted []admittedAt) {
	for _, a := range admitted {
		if _, _, err := s.admitter.Release(context.WithoutCancel(ctx), admission.FaceRLS, budget.ReleaseParams{TenantID: a.tenant, AdmissionID: a.id, GatewayID: gw.ID,
			Actor: "gateway:" + gw.Name}); err != nil {
			s.logger.Warn("release after a refused descriptor", "admission", a.id, "error", err.Error())
		}
	}
}

func (s *Server) family(model string) string {
	if model == "" {
		return model
	}
	if m, known := s.estimator.Table().Lookup(model); known {
		return m.Name
	}
	return model
}

// key is the Idempotency-Key under which a gateway's request is reserved.
func key(requestID string) string { return "rls:" + requestID }

func overLimit(n int, retry time.Duration) *rlsv3.RateLimitResponse {
	r := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}
	for range n {
		r.Statuses = append(r.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT,
			DurationUntilReset: durationpb.New(retry)})
	}
	r.ResponseHeadersToAdd = []*corev3.HeaderValue{{Key: "retry-after", Value: strconv.FormatInt(rule.RetryAfterSeconds(retry), 10)}}
	return r
}

func clamp32(v int64) uint32 { return uint32(max(0, min(v, math.MaxUint32))) }

// statusOf is a descriptor's status: the token bucket's limit and
// remaining, or those of the exhausted window that refused it (exh). A
// wait refill can never end (rule.Never) has no duration_until_reset.
func statusOf(rej *rule.RejectedError, snap *rule.Snapshot, exh *rule.BudgetExhaustedError) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	if snap != nil {
		st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: "tokens", RequestsPerUnit: clamp32(snap.Limits.TokensCapacity),
			Unit: rlsv3.RateLimitResponse_RateLimit_SECOND}
		st.LimitRemaining = clamp32(snap.Tokens())
		if !rule.Never(snap.TokensFullIn) {
			st.DurationUntilReset = durationpb.New(snap.TokensFullIn)
		}
	}
	if rej != nil {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		st.DurationUntilReset = nil
		if !rej.Never() {
			st.DurationUntilReset = durationpb.New(time.Duration(rule.RetryAfterMillis(rej.RetryAfter)) * time.Millisecond)
		}
	}
	if exh != nil {
		st.CurrentLimit, st.LimitRemaining = windowLimit(exh)
	}
	return st
}

// headers are the x-ratelimit headers of the HTTP API, for Envoy to add to
// the response, and retry-after when refused.
func headers(snap rule.Snapshot, resp *rlsv3.RateLimitResponse) []*corev3.HeaderValue {
	var h []*corev3.HeaderValue
	for _, rh := range snap.RateHeaders() {
		h = append(h, &corev3.HeaderValue{Key: strings.ToLower(rh.Name), Value: rh.Value})
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		var longest time.Duration
		never := false
		for _, st := range resp.Statuses {
			if st.Code != rlsv3.RateLimitResponse_OVER_LIMIT {
				continue
			}
			if st.DurationUntilReset == nil {
				never = true // refill can never make room: no time to promise
				continue
			}
			longest = max(longest, st.DurationUntilReset.AsDuration())
		}
		if never {
			return append(h, &corev3.HeaderValue{Key: "x-should-retry", Value: "false"})
		}
		h = append(h, &corev3.HeaderValue{Key: "retry-after", Value: strconv.FormatInt(rule.RetryAfterSeconds(longest), 10)})
	}
	return h
}

// metadataCarrier reads and writes a gRPC call's metadata as W3C trace
// context headers (its keys are lower case, as traceparent is).
type metadataCarrier metadata.MD

func (m metadataCarrier) Get(key string) string {
	if v := metadata.MD(m).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (m metadataCarrier) Set(key, value string) { metadata.MD(m).Set(key, value) }

func (m metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}
