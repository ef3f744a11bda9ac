package admission

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// MaxHits bounds the count of one of a gateway's Hits: a count of tokens,
// so the bound on any token count (rule.MaxTokens).
const MaxHits = rule.MaxTokens

// HitsPhase is what a gateway's Hits stand for.
type HitsPhase int

// The phases of Hits.
const (
	// HitsRequest asks for Count tokens for a request: a reservation.
	HitsRequest HitsPhase = iota
	// HitsResponse reports, at the request's stream end, the Count tokens
	// it used: its reservation is settled with them.
	HitsResponse
	// HitsRefund gives Count tokens of the request's reservation back.
	HitsRefund
)

// Hits is one descriptor of a gateway's call (the rate limit service):
// Count tokens of Model for a tenant's request, which RequestID names
// across the calls of the request ("" for none).
type Hits struct {
	TenantID  string
	Model     string
	RequestID string
	Count     int64
	Phase     HitsPhase
}

// HitsCall is a gateway's call: its Hits, decided as one (DecideHits).
type HitsCall struct {
	Face      Face
	GatewayID string // the gateway credential the call came through
	Actor     string // the ledger's actor of its entries
	Hits      []Hits
	// Start is when the face took the call ("" : when DecideHits is
	// called).
	Start time.Time
}

// HitsResult is the decision on one of a call's Hits: its tenant's
// balances (nil when nothing names them: a stream end whose reservation
// the store does not know, or journaled during an outage), or Err: its
// own refusal (a *rule.RejectedError, a *rule.WithheldError), a
// denial (rule.ErrTenantNotFound and the like), or a failure.
type HitsResult struct {
	Snapshot *rule.Snapshot
	Err      error
}

// hitsKey is the Idempotency-Key under which a gateway's request is
// reserved: its request id, in a namespace of its own.
func hitsKey(requestID string) string { return "rls:" + requestID }

// CheckHits is the form every Hits of a call must have: a tenant, a
// request id for a stream end or refund, whose key is an idempotency key,
// a model name of at most 256 bytes, a count from 0 to MaxHits. It returns
// a *rule.InvalidError naming the descriptor (by index) at fault.
func CheckHits(hits []Hits) error {
	if len(hits) == 0 {
		return &rule.InvalidError{Field: "descriptors", Reason: "a call needs at least one descriptor"}
	}
	for i, h := range hits {
		field := func(f string) string { return "descriptor " + strconv.Itoa(i) + ": " + f }
		switch {
		case h.TenantID == "":
			return &rule.InvalidError{Field: field("tenant"), Reason: "is required"}
		case h.Phase != HitsRequest && h.RequestID == "":
			return &rule.InvalidError{Field: field("request_id"), Reason: "is required at stream end and for a refund"}
		case len(h.Model) > 256:
			return &rule.InvalidError{Field: field("model"), Reason: "too long"}
		case h.Count < 0 || h.Count > MaxHits:
			return &rule.InvalidError{Field: field("hits"), Reason: "must be 0 to " + strconv.FormatInt(MaxHits, 10)}
		}
		if h.RequestID != "" {
			// It keys the reservation: the domain's rule for idempotency
			// keys, leaving room for the namespace's prefix.
			if problem := rule.IdempotencyKeyProblem(hitsKey(h.RequestID)); problem != "" {
				return &rule.InvalidError{Field: field("request_id"),
					Reason: problem + " (" + strconv.Itoa(rule.MaxIdempotencyKey-len(hitsKey(""))) + " at most)"}
			}
		}
	}
	return nil
}

// DecideHits decides a gateway's call: its stream ends and refunds each
// settle their request's reservation (one the store does not know, or
// settled already with other usage, is answered with no balances: the
// first answer stands), and its requests are reserved as one decision,
// all or none (ReserveAll), each priced here at its Count of tokens. The
// error is the call's own: a *rule.InvalidError (CheckHits), counted as
// an invalid admission, with nothing decided; each result carries its
// Hits' decision.
func (a *Admitter) DecideHits(ctx context.Context, call HitsCall) ([]HitsResult, error) {
	if call.Start.IsZero() {
		call.Start = time.Now()
	}
	if err := CheckHits(call.Hits); err != nil {
		a.Invalid(call.Face, call.Start)
		return nil, err
	}
	out := make([]HitsResult, len(call.Hits))
	var reqs []Request
	var at []int // the index of each of reqs in the call
	for i, h := range call.Hits {
		switch {
		case h.Phase != HitsRequest:
			out[i] = a.settleHits(ctx, call, h)
		case len(call.Hits) == 1:
			// The usual call: one request, decided as Reserve decides
			// every face's, with nothing gathered.
			r, _, err := a.Reserve(ctx, a.hitsRequest(call, h))
			out[i] = hitsResult(r, err)
		default:
			reqs = append(reqs, a.hitsRequest(call, h))
			at = append(at, i)
		}
	}
	for j, d := range a.ReserveAll(ctx, reqs) {
		out[at[j]] = hitsResult(d.Reservation, d.Err)
	}
	return out, nil
}

// hitsResult is a request's Hits' decision: its tenant's balances as the
// reservation, refusal or withholding left them.
func hitsResult(r *account.Reservation, err error) HitsResult {
	var rej *rule.RejectedError
	var wh *rule.WithheldError
	switch {
	case err == nil:
		return HitsResult{Snapshot: &r.Snapshot}
	case errors.As(err, &rej):
		return HitsResult{Snapshot: &rej.Snapshot, Err: err}
	case errors.As(err, &wh):
		return HitsResult{Snapshot: &wh.Snapshot, Err: err}
	}
	return HitsResult{Err: err}
}

// hitsRequest is the admission a request's Hits ask for: Count tokens of
// input at weight one, keyed by its request id. Envoy retrying the call
// sends the same descriptor, which is the request's fingerprint.
func (a *Admitter) hitsRequest(call HitsCall, h Hits) Request {
	p := account.ReserveParams{TenantID: h.TenantID, Actor: call.Actor, GatewayID: call.GatewayID,
		Estimate: estimator.Estimate{Model: h.Model, Family: a.family(h.Model), InputTokens: h.Count, Cost: h.Count,
			InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}
	if h.RequestID != "" {
		// The stream-end call finds the reservation by it; a retry is
		// answered OK with the balances now: no answer kept.
		p.IdempotencyKey, p.ReplayNow = hitsKey(h.RequestID), true
	}
	body := []byte(h.TenantID + "\x00" + h.RequestID + "\x00" + strconv.FormatInt(h.Count, 10))
	return Request{ReserveParams: p, Face: call.Face, Body: body, Start: call.Start}
}

// settleHits settles the reservation of a stream end's or refund's
// request, found by its request id inside the decision's transaction
// (which also checks the gateway). The call's model, if it names one, is
// the request's failure policy: a settle that comes before a local
// admission's replay is kept.
func (a *Admitter) settleHits(ctx context.Context, call HitsCall, h Hits) HitsResult {
	p := account.SettleParams{TenantID: h.TenantID, IdempotencyKey: hitsKey(h.RequestID), InputTokens: h.Count, Actor: call.Actor,
		GatewayID: call.GatewayID, Family: a.family(h.Model)}
	if h.Phase == HitsRefund {
		p.InputTokens, p.RefundTokens = 0, h.Count
	}
	st, _, err := a.Settle(ctx, call.Face, p)
	switch {
	case errors.Is(err, rule.ErrAdmissionNotFound), errors.Is(err, rule.ErrConflict):
		// Refused, or older than 24 h; or admitted by a replica on its own
		// and not replayed yet, and kept for it (account.ErrDeferred); or
		// settled already with other usage: the first answer stands.
		return HitsResult{}
	case err != nil:
		return HitsResult{Err: err}
	case st == nil:
		return HitsResult{} // journaled during an outage
	}
	return HitsResult{Snapshot: &st.Snapshot}
}

// family is the model family of a model name the table knows (its failure
// policy and model limits apply), else the name itself.
func (a *Admitter) family(model string) string {
	if model == "" || a.cfg.Estimator == nil {
		return model
	}
	if m, known := a.cfg.Estimator.Table().Lookup(model); known {
		return m.Name
	}
	return model
}
