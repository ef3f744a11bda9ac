package proxy

import (
	"errors"
	"io"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// ServeHTTP serves every route of every wire: the first dialect that
// routes the call serves it, on the one path.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r = p.withTrace(r)
	if p.serveBatch(w, r) {
		return
	}
	for _, d := range p.wires {
		if rt, ok := d.route(r); ok {
			p.serve(w, r, d, rt)
			return
		}
	}
	fail(w, p.wires[0], problem{code: codeNotFound})
}

// serve is the path of every call on every wire: authenticate the key,
// apply its rule, take the estimate gate, read and parse the body, have
// the use case estimate and reserve it (admission.Admitter.Admit), and
// forward; or answer a count from the use case's estimate (Quote). Each
// failure is answered in d's terms and counted once.
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, d dialect, rt route) {
	switch {
	case rt.unserved:
		fail(w, d, problem{code: codeUnserved, message: "tokengate does not proxy " + r.Method + " " + r.URL.Path})
		return
	case d.upstream(&p.cfg) == nil:
		fail(w, d, problem{code: codeNotFound})
		return
	case r.Method != http.MethodPost:
		fail(w, d, problem{code: codeMethod, message: "use POST"})
		return
	}
	ctx := r.Context()
	start := time.Now()
	principal, err := p.guard.TenantDeferred(ctx, p.cfg.ClientAddr(r), d.key(r))
	if err != nil {
		p.calls.WithLabelValues("refused").Inc()
		writeDomainError(w, d, err)
		return
	}
	// invalid counts a call refused as invalid before it could be decided:
	// in the proxy's calls and, like every face's, in the admissions (a
	// count is no admission).
	invalid := func(pr problem) {
		p.calls.WithLabelValues("invalid").Inc()
		if !rt.count {
			p.admitter.Invalid(admission.FaceProxy, start)
		}
		fail(w, d, pr)
	}
	var idem string
	if !rt.count {
		var bad string
		if idem, bad = idempotencyKey(r); bad != "" {
			invalid(problem{code: codeInvalid, param: "Idempotency-Key", message: bad})
			return
		}
	}
	release, err := p.gate(r, principal.TenantID)
	if p.notEstimated(err) {
		writeDomainError(w, d, err)
		return
	}
	defer release()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, p.cfg.BodyLimit))
	if err != nil {
		p.calls.WithLabelValues("invalid").Inc()
		fail(w, d, bodyProblem(w.Header(), err))
		return
	}
	req, err := d.parse(rt, r, body)
	if err != nil {
		invalid(requestProblem(err))
		return
	}
	if rt.count {
		est, err := p.admitter.Quote(req)
		release()
		if err != nil {
			invalid(requestProblem(err))
			return
		}
		d.count(p, w, r, body, est)
		return
	}
	forward, err := d.prepare(&rt, body)
	if err != nil {
		invalid(requestProblem(err))
		return
	}
	// The use case estimates and prices the parsed call, gives back the
	// gate once it is estimated (a reservation may wait), and reserves.
	ad, err := p.admitter.Admit(ctx, admission.AdmitRequest{Parsed: req, EstimatedFunc: release,
		Request: admission.Request{Face: admission.FaceProxy, Start: start, Body: body, EndUser: endUserOf(r),
			ReserveParams: account.ReserveParams{TenantID: principal.TenantID, IdempotencyKey: idem,
				Actor: "proxy:key:" + principal.KeyID, KeyID: principal.KeyID}}})
	if !ad.Decided {
		// Its estimate refused it, counted as an invalid admission by the
		// use case.
		p.calls.WithLabelValues("invalid").Inc()
		fail(w, d, requestProblem(err))
		return
	}
	res := ad.Reservation
	if err != nil {
		outcome := "refused"
		if inv := (*rule.InvalidError)(nil); errors.As(err, &inv) {
			outcome = "invalid" // counted as an invalid admission by the admission layer
		}
		p.calls.WithLabelValues(outcome).Inc()
		writeDomainError(w, d, err)
		return
	}
	d.rateHeaders(w.Header(), res.Snapshot)
	w.Header().Set("X-Tokengate-Admission", res.AdmissionID)
	if res.Replayed {
		// A retry of a call that was admitted: its answer went to the first
		// caller, and a second upstream call would run (and cost) again.
		fail(w, d, problem{code: codeReplayed, param: "Idempotency-Key",
			message: "this Idempotency-Key was admitted already (admission " + res.AdmissionID + "); send a new key to call again"})
		return
	}
	c := &call{p: p, d: d, rt: rt, principal: principal, admission: res, est: ad.Estimate}
	c.relay(w, r, forward)
}

// call is one admitted request on its way to the upstream and back.
type call struct {
	p         *Proxy
	d         dialect
	rt        route
	principal credential.Principal
	admission *account.Reservation
	est       estimator.Estimate
	// parent is the caller's span and upstream the upstream call's, while
	// tracing is on (trace.go).
	parent, upstream trace.Span
}

// relay sends an admitted call upstream and its answer back, and ends its
// reservation on every path: released when nothing reached the model or
// the upstream refused before any output; settled from the usage the
// answer or stream reports, else from the estimate or what was streamed.
func (c *call) relay(w http.ResponseWriter, r *http.Request, body []byte) {
	ureq, err := c.d.request(r.Context(), &c.p.cfg, r, body)
	if err != nil {
		c.release()
		fail(w, c.d, problem{code: codeUpstream, message: "the upstream request could not be built"})
		return
	}
	c.startUpstream(r, ureq, c.d.provider())
	defer c.endUpstream()
	resp, err := c.p.cfg.Client.Do(ureq)
	if err != nil {
		c.upstreamAnswered(0, err)
		// Nothing reached the model (or nothing came back before the
		// client left): nothing is charged.
		c.release()
		c.p.calls.WithLabelValues("upstream_error").Inc()
		fail(w, c.d, problem{code: codeUpstream, message: "the upstream did not answer"})
		return
	}
	defer resp.Body.Close()
	c.upstreamAnswered(resp.StatusCode, nil)
	c.d.answered(resp.Header)
	if resp.StatusCode >= 300 {
		// The upstream refused or failed before any output: released, and
		// its answer relayed as it is (the SDKs retry its 429s and 5xxs).
		c.release()
		c.p.calls.WithLabelValues("upstream_error").Inc()
		copyHeaders(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, io.LimitReader(resp.Body, 1<<20))
		return
	}
	if fr := c.d.framing(c.rt, resp.Header); fr != nil {
		c.stream(w, resp, fr)
		return
	}
	out, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		// The answer broke off: no usage to settle from, and the model ran.
		c.settle(c.estimated())
		fail(w, c.d, problem{code: codeUpstream, message: "the upstream's answer broke off"})
		return
	}
	if u, ok := c.d.usage(c.rt, out); ok {
		c.settle(u)
	} else {
		c.settle(c.estimated()) // no usage reported: the estimate stands
	}
	copyHeaders(w.Header(), resp.Header)
	w.Header().Del("Content-Length")
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(out)
}

// stream relays a streamed answer event by event, as its wire frames it
// (fr: SSE events, JSON array elements) and its wire's reader reads it,
// and settles: before the event that makes its usage final is relayed,
// else (the stream broke, or the client left) with what was streamed so
// far. A stream the upstream broke off before its framing closed is broken
// off to the client too, settled or not (a silent one: rd.silent).
func (c *call) stream(w http.ResponseWriter, resp *http.Response, fr framing) {
	rd := c.d.stream(c.rt, c.est, c.p.admitter)
	settled := false
	clientGone := relayEvents(w, resp, fr, func(data []byte) bool {
		forward, final := rd.event(data)
		if final && !settled {
			c.settle(rd.usage())
			settled = true
		}
		return forward
	})
	if settled {
		if !clientGone && !fr.closed() {
			panic(http.ErrAbortHandler)
		}
		return
	}
	c.settle(rd.usage())
	if !clientGone && (rd.silent() || !fr.closed()) {
		panic(http.ErrAbortHandler)
	}
}

// estimated is the usage of a call that reported none: its estimate.
func (c *call) estimated() rule.Usage {
	return rule.Usage{Input: c.est.InputTokens, Output: c.est.OutputTokens}
}

// settle reconciles the admission with what the call used, whatever
// happened to the client meanwhile. The use case bounds the usage the
// upstream reported (admission.Admitter.SettleReported): usage no request
// could produce is clamped, and counted here as outcome usage_clamped.
func (c *call) settle(reported rule.Usage) {
	c.upstreamUsage(reported.Input, reported.Output)
	ctx, cancel := c.endCtx()
	defer cancel()
	clamped, err := c.p.admitter.SettleReported(ctx, admission.FaceProxy, c.est, reported, account.SettleParams{TenantID: c.tenantID(),
		AdmissionID: c.admission.AdmissionID, Actor: "proxy:key:" + c.principal.KeyID})
	if err != nil {
		// It stays reserved and expires at its TTL, charged at its estimate.
		c.p.logger.Error("proxy settle failed; the reservation will expire", "admission", c.admission.AdmissionID, "error", err.Error())
		return
	}
	if clamped {
		c.p.calls.WithLabelValues("usage_clamped").Inc()
		return
	}
	c.p.calls.WithLabelValues("settled").Inc()
}

// endTimeout bounds a call's settle or release.
const endTimeout = 10 * time.Second

func (c *call) release() {
	ctx, cancel := c.endCtx()
	defer cancel()
	if _, _, err := c.p.admitter.Release(ctx, admission.FaceProxy, account.ReleaseParams{TenantID: c.tenantID(),
		AdmissionID: c.admission.AdmissionID, Actor: "proxy:key:" + c.principal.KeyID}); err != nil {
		c.p.logger.Error("proxy release failed; the reservation will expire", "admission", c.admission.AdmissionID, "error", err.Error())
		return
	}
	c.p.calls.WithLabelValues("released").Inc()
}
