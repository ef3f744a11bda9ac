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
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
)

// The descriptor entries a call may carry.
const (
	EntryTenant    = "tenant"     // required: the tenant asked for
	EntryModel     = "model"      // the model (its failure policy applies)
	EntryRequestID = "request_id" // ties the stream-end call to the reservation
	EntryPhase     = "phase"      // "request" (default: reserve) or "response" (settle)
)

// Server implements RateLimitServiceServer.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	admitter *admission.Admitter
	guard    *credential.Guard
	tracing  *replica.Tracing // nil or off: no trace context is read
	calls    *prometheus.CounterVec
	refused  *prometheus.CounterVec
}

// New returns a Server on the replica's services; its metrics join the
// replica's registry.
func New(rep *replica.Replica) *Server {
	s := &Server{
		admitter: rep.Admitter, guard: rep.Guard, tracing: rep.Tracing,
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

// parse reads a call's descriptors as the use case's Hits, and checks
// their form (admission.CheckHits).
func parse(req *rlsv3.RateLimitRequest) ([]admission.Hits, error) {
	if err := checkEntries(req); err != nil {
		return nil, err
	}
	out := make([]admission.Hits, 0, len(req.Descriptors))
	for i, d := range req.Descriptors {
		var h admission.Hits
		for _, e := range d.GetEntries() {
			switch e.GetKey() {
			case EntryTenant:
				h.TenantID = e.GetValue()
			case EntryModel:
				h.Model = e.GetValue()
			case EntryRequestID:
				h.RequestID = e.GetValue()
			case EntryPhase:
				switch e.GetValue() {
				case "request":
				case "response":
					h.Phase = admission.HitsResponse
				default:
					return nil, errors.New("descriptor " + strconv.Itoa(i) + ": phase must be request or response")
				}
			}
		}
		// Hits: the descriptor's own, else the call's; an unset call
		// value means 1, as for Envoy's own service.
		h.Count = int64(req.GetHitsAddend())
		if v := d.GetHitsAddend(); v != nil {
			h.Count = int64(min(v.GetValue(), uint64(math.MaxInt64)))
		} else if h.Count == 0 {
			h.Count = 1
		}
		if d.GetIsNegativeHits() {
			h.Phase = admission.HitsRefund
		}
		out = append(out, h)
	}
	if err := admission.CheckHits(out); err != nil {
		return nil, err
	}
	return out, nil
}

// gatewayOf authenticates the caller from its "authorization: Bearer
// tgw_..." metadata.
func (s *Server) gatewayOf(ctx context.Context) (credential.Gateway, error) {
	// ValueFromIncomingContext reads the one key without copying the
	// call's metadata, as FromIncomingContext does (2 % of the server's CPU
	// under bench-peer's load).
	var presented string
	for _, v := range metadata.ValueFromIncomingContext(ctx, "authorization") {
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
// OVER_LIMIT (refused: nothing debited, for any of its descriptors). A
// caller that is not an authenticated gateway scoped to the tenant gets
// OVER_LIMIT with no decision. A store failure is a gRPC Unavailable
// error, so Envoy applies its failure_mode_deny. The call is one call of
// the use case (admission.Admitter.DecideHits), whose results are mapped
// back by index.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	if s.tracing.On() {
		// The caller's trace (Envoy's traceparent metadata): each
		// decision's span is a child of its span.
		md, _ := metadata.FromIncomingContext(ctx)
		ctx = s.tracing.Extract(ctx, metadataCarrier(md))
	}
	hits, err := parse(req)
	if err != nil {
		// Counted as every face counts a request it cannot decide.
		s.admitter.Invalid(admission.FaceRLS, start)
		s.calls.WithLabelValues("request", "error").Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	gw, err := s.gatewayOf(ctx)
	var throttled *credential.ThrottledError
	switch {
	case errors.As(err, &throttled):
		s.refused.WithLabelValues("throttled").Inc()
		return overLimit(len(hits), throttled.RetryAfter), nil
	case errors.Is(err, credential.ErrGatewayInvalid):
		s.refused.WithLabelValues("unauthenticated").Inc()
		return overLimit(len(hits), time.Second), nil
	case err != nil:
		return nil, status.Error(codes.Unavailable, "the store cannot authenticate the gateway now")
	}
	for _, h := range hits {
		if !gw.May(h.TenantID) {
			s.refused.WithLabelValues("out_of_scope").Inc()
			return overLimit(len(hits), time.Second), nil
		}
	}
	results, err := s.admitter.DecideHits(ctx, admission.HitsCall{Face: admission.FaceRLS, GatewayID: gw.ID, Actor: "gateway:" + gw.Name,
		Hits: hits, Start: start})
	if err != nil {
		s.calls.WithLabelValues("request", "error").Inc()
		return nil, status.Error(verdictOf(err).code, err.Error())
	}

	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	var last *rule.Snapshot
	var exhausted *rule.BudgetExhaustedError // the first descriptor refused by an exhausted window
	for i, r := range results {
		phase := "request"
		if hits[i].Phase != admission.HitsRequest {
			phase = "response"
		}
		var rej *rule.RejectedError
		var exh *rule.BudgetExhaustedError
		switch {
		case r.Err == nil, errors.Is(r.Err, rule.ErrWithheld):
			// Withheld: its own limits admitted it, another descriptor's
			// refused the call.
			s.calls.WithLabelValues(phase, "ok").Inc()
		case errors.As(r.Err, &rej):
			s.calls.WithLabelValues(phase, "over_limit").Inc()
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			if errors.As(r.Err, &exh) && exhausted == nil {
				exhausted = exh
			}
		default:
			v := verdictOf(r.Err)
			if v.code != codes.OK {
				s.calls.WithLabelValues(phase, "error").Inc()
				return nil, status.Error(v.code, v.message)
			}
			// Denied like a refusal, with nothing decided.
			s.calls.WithLabelValues(phase, "over_limit").Inc()
			s.refused.WithLabelValues(v.reason).Inc()
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.Statuses = append(resp.Statuses, statusOf(&rule.RejectedError{RetryAfter: time.Second}, nil, nil))
			continue
		}
		if r.Snapshot != nil {
			last = r.Snapshot
		}
		resp.Statuses = append(resp.Statuses, statusOf(rej, r.Snapshot, exh))
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
	case errors.Is(err, rule.ErrEndUserCap):
		return verdict{code: codes.OK, reason: "end_user_cap"}
	case errors.Is(err, rule.ErrModelNotAllowed):
		// The descriptor's model is outside the key's or tenant's scope:
		// refused like a tenant Envoy may not admit, nothing decided.
		return verdict{code: codes.OK, reason: "model_not_allowed"}
	case errors.As(err, &tl), errors.As(err, &inv), errors.Is(err, rule.ErrIdempotencyMismatch),
		errors.Is(err, rule.ErrUsageOutOfBounds), errors.Is(err, rule.ErrOverflow):
		// The caller's own mistake (usage no request could produce, for
		// one): nothing moved, and retrying will not help.
		return verdict{code: codes.InvalidArgument, message: err.Error()}
	case account.IsInvalidInput(err):
		// The store refused a value the call sent: the caller's error,
		// never an outage (and no raw database message).
		return verdict{code: codes.InvalidArgument, message: "a descriptor value cannot be stored (a NUL character, a character outside UTF-8, or too long)"}
	}
	// The store cannot decide now: Envoy applies its failure_mode_deny.
	return verdict{code: codes.Unavailable, message: err.Error()}
}

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
	rhs := snap.RateHeaders()
	h := make([]*corev3.HeaderValue, 0, len(rhs)+1)
	for _, rh := range rhs {
		h = append(h, &corev3.HeaderValue{Key: lowerName(rh.Name), Value: rh.Value})
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

// lowerNames are the rate headers' names as Envoy adds them, lower case,
// so that a call does not lower each name again. It holds at most the
// handful of names rule.Snapshot.RateHeaders writes, all constants.
var lowerNames sync.Map // string -> string

func lowerName(name string) string {
	if v, ok := lowerNames.Load(name); ok {
		return v.(string)
	}
	l := strings.ToLower(name)
	lowerNames.Store(name, l)
	return l
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
