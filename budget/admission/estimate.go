package admission

import (
	"context"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// A face parses its wire's body into an *estimator.Request (the wire's
// shape is the face's to know) and hands it here: estimating and pricing
// it against the replica's model table, reserving it, counting the output
// of a stream that reported no usage, and bounding the usage an upstream
// reported are the use case's, once for every face, so that no face holds
// the model table or prices anything itself.

// AdmitRequest is a request a face parsed, to estimate and reserve.
type AdmitRequest struct {
	// Request is the admission to decide: its ReserveParams.Estimate is
	// Admit's to fill, and its MaxWait and EndUser.Fields are read from
	// Parsed when it gives them.
	Request
	// Parsed is the request as its face's wire parsed it.
	Parsed *estimator.Request
	// EstimatedFunc, when set, is called once Parsed is estimated (or
	// refused) and before anything is reserved: the face gives back its
	// share of the estimate gate there, since estimation is done and a
	// reservation may wait. (The gate's release itself: no closure is
	// made per call.)
	EstimatedFunc func()
}

// Admitted is what Admit decided.
type Admitted struct {
	// Reservation is the admission made, nil when none was.
	Reservation *account.Reservation
	// Estimate is what the request was estimated to cost (zero when it
	// could not be estimated): what the reservation holds, and what the
	// face answers with when it is refused.
	Estimate estimator.Estimate
	// Decided says whether the request reached the decision. When it did
	// not, Admit's error is the request's own fault (its estimate),
	// already counted as an invalid admission.
	Decided bool
	// Local says whether this replica decided on its own, the store not
	// answering (Reserve).
	Local bool
}

// Admit estimates and prices req.Parsed with the replica's model table,
// then reserves it (Reserve). An estimate that fails is an
// *estimator.InvalidError naming the field at fault, counted as an invalid
// admission of req.Face, and nothing is reserved. Otherwise it returns
// what Reserve returns, with the estimate.
func (a *Admitter) Admit(ctx context.Context, req AdmitRequest) (Admitted, error) {
	if req.Start.IsZero() {
		req.Start = time.Now()
	}
	est, err := a.est.Estimate(req.Parsed)
	if req.EstimatedFunc != nil {
		req.EstimatedFunc()
	}
	if err != nil {
		a.Invalid(req.Face, req.Start)
		return Admitted{Estimate: est}, err
	}
	r := req.Request
	r.Estimate = est
	if ms := req.Parsed.MaxWaitMS(); ms > 0 {
		r.MaxWait = time.Duration(ms) * time.Millisecond
	}
	r.EndUser.Fields = req.Parsed.EndUserFields()
	res, local, err := a.Reserve(ctx, r)
	return Admitted{Reservation: res, Estimate: est, Decided: true, Local: local}, err
}

// Quote estimates and prices a parsed request as Admit would, reserving
// and counting nothing: the HTTP API's POST /v1/estimate, Anthropic's
// count_tokens. Its error is an *estimator.InvalidError naming the field
// at fault.
func (a *Admitter) Quote(parsed *estimator.Request) (estimator.Estimate, error) {
	return a.est.Estimate(parsed)
}

// ParseFor parses a body whose route does not say what API it is (the
// HTTP API's): whether its input is an embeddings call depends on the
// replica's model table (estimator.Estimator.ParseFor), which the faces
// do not hold.
func (a *Admitter) ParseFor(body []byte) (*estimator.Request, error) {
	return a.est.ParseFor(body)
}

// CountOutput counts the text a model streamed, for a stream that ended
// without reporting its usage, as the estimate of a request reserved as
// est counted its texts: in o200k_base times est.TextFactorMilli for a
// wire whose tokenizer is not offline (Anthropic's Messages API,
// Gemini's), else with its model's encoding. Zero when the text cannot
// be counted.
func (a *Admitter) CountOutput(est estimator.Estimate, text string) int64 {
	if f := est.TextFactorMilli; f > 0 {
		n, err := estimator.CountText(estimator.EncodingO200K, text)
		if err != nil {
			return 0
		}
		return (int64(n)*f + 999) / 1000
	}
	m, _ := a.est.Table().Lookup(est.Model)
	if m.Encoding == "" {
		return 0
	}
	n, err := estimator.CountText(m.Encoding, text)
	if err != nil {
		return 0
	}
	return int64(n)
}

// SettleReported settles an admission reserved as est from the usage its
// upstream reported (p's token counts are set from it). That usage is a
// fact, not a claim: the request already ran. But usage beyond what any
// call could state (rule.Usage.Clamp) or this request could produce (more
// output than it reserved, more than the model's context window:
// account.SettleBounds) is an upstream's error, and would charge the
// tenant without bound: it is clamped to the bound, its parts with it,
// and logged, and clamped is true. The cache's tokens are priced at the
// model's cache weights in the settle's own transaction. Otherwise it
// returns what Settle returns.
func (a *Admitter) SettleReported(ctx context.Context, face Face, est estimator.Estimate, reported rule.Usage, p account.SettleParams) (clamped bool, err error) {
	u, _ := reported.Clamp()
	bound := account.SettleBounds(est, a.est.Table())
	in, out, over := bound.Clamp(u.Input, u.Output)
	u.Input, u.Output = in, out
	u, _ = u.Clamp()
	clamped = over || u.Input != reported.Input || u.Output != reported.Output
	if clamped {
		a.logger.Warn(string(face)+": the upstream reported usage no request could produce; clamped to the bound",
			"admission", p.AdmissionID, "model", est.Model, "input_tokens", reported.Input, "output_tokens", reported.Output,
			"max_output_tokens", bound.MaxOutput, "max_total_tokens", bound.MaxTotal, "settled_input", u.Input, "settled_output", u.Output)
	}
	p.InputTokens, p.OutputTokens = u.Input, u.Output
	p.CachedInputTokens, p.CacheWriteTokens, p.CacheWrite1hTokens = u.CacheRead, u.CacheWrite5m, u.CacheWrite1h
	p.ReasoningTokens, p.ServiceTier = u.Reasoning, reported.Tier
	_, _, err = a.Settle(ctx, face, p)
	return clamped, err
}
