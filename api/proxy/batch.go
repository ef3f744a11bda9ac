package proxy

// Batches through the proxy (budget/batch): OpenAI's Batch API
// (batch_openai.go) and Anthropic's Message Batches (batch_anthropic.go).
// Every line of a batch is read and estimated as its single request would
// be, the whole batch is reserved against the tenant's enqueued-tokens
// allowance before the upstream sees it, and it is settled per custom_id
// from the results the upstream reports when it ends. The domain decides;
// these files only translate the wires.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/tokengate/tokengate/budget/batch"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// DefaultBatchFileBytes bounds a batch input file (or an Anthropic batch
// body) unless Config.BatchFileLimit says otherwise: OpenAI's own limit
// for a batch file.
const DefaultBatchFileBytes = 200 << 20

// maxBatchResults bounds the results file the proxy reads from the
// upstream to settle a batch.
const maxBatchResults = 2 << 30

// batchHandler serves one batch route for an authenticated tenant; id is
// the route's file or batch id ("" when it names none).
type batchHandler func(w http.ResponseWriter, r *http.Request, principal credential.Principal, id string)

// serveBatch serves the batch routes of the wires whose upstream is set,
// and says whether r was one. A wire's router names the route's handler
// (or answers r itself: a route tokengate does not serve); the key is
// authenticated here, once for every wire.
func (p *Proxy) serveBatch(w http.ResponseWriter, r *http.Request) bool {
	if p.batches == nil {
		return false
	}
	var d dialect
	var serve batchHandler
	var id string
	handled := false
	if p.cfg.Upstream != nil {
		d = openAI{}
		serve, id, handled = p.openAIBatchRoute(w, r)
	}
	if !handled && p.cfg.AnthropicUpstream != nil {
		d = anthropic{}
		serve, id, handled = p.anthropicBatchRoute(w, r)
	}
	if !handled || serve == nil {
		return handled
	}
	principal, ok := p.batchPrincipal(w, r, d)
	if ok {
		serve(w, r, principal, id)
	}
	return true
}

// batchGate takes a batch body's bytes of the estimate gate, as gate does
// a call's, up to the batch file limit: a file larger than the gate runs
// alone.
func (p *Proxy) batchGate(r *http.Request, tenantID string) (release func(), err error) {
	n := p.batchFileLimit()
	if r.ContentLength >= 0 {
		n = min(r.ContentLength, n)
	}
	release, err = p.estimates.Acquire(r.Context(), tenantID, n)
	if err != nil {
		return nil, estimator.ErrBusy
	}
	return release, nil
}

func (p *Proxy) batchFileLimit() int64 {
	if p.cfg.BatchFileLimit > 0 {
		return p.cfg.BatchFileLimit
	}
	return DefaultBatchFileBytes
}

// batchPrincipal authenticates a batch call's key, answering a refusal
// in d's terms (false: answered).
func (p *Proxy) batchPrincipal(w http.ResponseWriter, r *http.Request, d dialect) (credential.Principal, bool) {
	principal, err := p.guard.TenantDeferred(r.Context(), p.cfg.ClientAddr(r), d.key(r))
	if err != nil {
		writeDomainError(w, d, err)
		return credential.Principal{}, false
	}
	return principal, true
}

// batchFail answers a batch call's failure in d's shape: the domain's
// batch errors here (a refused line named as the wire names it: line
// says how), every other through the proxy's one table.
func batchFail(w http.ResponseWriter, d dialect, err error, line func(n int) string) {
	var le *batch.LineError
	var ae *batch.AllowanceError
	var inv *estimator.InvalidError
	var scope *rule.ModelNotAllowedError
	switch {
	case errors.As(err, &le) && errors.As(err, &scope):
		// A line's model outside the key's or tenant's scope: the refusal
		// of a single request of it, naming the line.
		name := line(le.Line)
		w.Header().Set("X-Should-Retry", "false")
		d.writeError(w, statuses[codeModelNotAllowed], d.shape(codeModelNotAllowed).typ, name,
			fmt.Sprintf("tokengate: model_not_allowed: %s (custom_id %q): %s: %s", name, le.CustomID, le.Field, scope.Message()))
	case errors.As(err, &inv):
		d.writeError(w, http.StatusBadRequest, d.shape(codeInvalid).typ, inv.Field, inv.Reason)
	case errors.As(err, &le):
		who := ""
		if le.CustomID != "" {
			who = fmt.Sprintf(" (custom_id %q)", le.CustomID)
		}
		name := line(le.Line)
		d.writeError(w, http.StatusBadRequest, d.shape(codeInvalid).typ, name, fmt.Sprintf("%s%s: %s %s", name, who, le.Field, le.Reason))
	case errors.As(err, &ae):
		// The allowance comes back as batches end, in hours: no SDK retry
		// helps.
		w.Header().Set("X-Should-Retry", "false")
		d.writeError(w, http.StatusTooManyRequests, d.shape(codeRejected).typ, "", "tokengate: "+strings.TrimPrefix(ae.Error(), "batch: "))
	case errors.Is(err, batch.ErrNoAllowance):
		d.writeError(w, http.StatusForbidden, d.shape(codeDisabled).typ, "", "tokengate: this tenant has no batch allowance; an administrator sets one (tokengate tenant batch-allowance)")
	case errors.Is(err, batch.ErrNotFound):
		notFound(w, d, "no batch of this tenant has that id")
	default:
		writeDomainError(w, d, err)
	}
}

// planBatch is a batch body's front half, once for every wire: the
// estimate gate, the body read up to the batch file limit, the wire's
// read of it into the lines their single calls would be, and the plan of
// every line (estimated and checked by the domain, against the key's
// and the tenant's model scopes). It answers a failure
// in d's shape, a refused line named as the wire names it (line); false:
// answered.
func (p *Proxy) planBatch(w http.ResponseWriter, r *http.Request, principal credential.Principal, d dialect, line func(n int) string,
	read func(body []byte) ([]batch.Line, error)) (body []byte, plan *batch.Plan, ok bool) {
	release, err := p.batchGate(r, principal.TenantID)
	if p.notEstimated(err) {
		writeDomainError(w, d, err)
		return nil, nil, false
	}
	defer release()
	body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, p.batchFileLimit()))
	if err != nil {
		fail(w, d, bodyProblem(w.Header(), err))
		return nil, nil, false
	}
	lines, err := read(body)
	if err == nil {
		plan, err = p.batches.Plan(r.Context(), principal.TenantID, principal.KeyID, lines)
	}
	if err != nil {
		batchFail(w, d, err, line)
		return nil, nil, false
	}
	return body, plan, true
}

// submitBatch is a batch's back half, once for every wire: it reserves
// the batch (rp), forwards body to the wire's create call at url, and
// binds the upstream's batch id to the reservation. A batch the upstream
// does not accept is refunded at once; its answer is relayed with the
// wire's headers edited (d.answered).
func (p *Proxy) submitBatch(w http.ResponseWriter, r *http.Request, d dialect, rp batch.ReserveParams, url string, set func(http.Header),
	body []byte, line func(n int) string) {
	b, err := p.batches.Reserve(r.Context(), rp)
	if err != nil {
		batchFail(w, d, err, line)
		return
	}
	w.Header().Set("X-Tokengate-Batch", b.ID)
	status, h, out, err := p.upstreamCall(r.Context(), http.MethodPost, url, "application/json", body, set, 1<<20)
	var created struct {
		ID string `json:"id"`
	}
	if err == nil && status < 300 && (json.Unmarshal(out, &created) != nil || created.ID == "") {
		err = errors.New("the upstream's answer names no batch id")
	}
	if err != nil || status >= 300 {
		p.refuseBatch(rp.TenantID, b.ID, rp.Actor)
		if err != nil {
			fail(w, d, problem{code: codeUpstream, message: "the upstream did not accept the batch"})
			return
		}
		d.answered(h)
		relayAnswer(w, status, h, out)
		return
	}
	if err := p.batches.Bind(r.Context(), rp.TenantID, b.ID, created.ID); err != nil {
		p.logger.Error("proxy: batch not bound to its upstream id; it expires with its window", "batch", b.ID, "upstream", created.ID, "error", err.Error())
	}
	d.answered(h)
	relayAnswer(w, status, h, out)
}

// batchCall forwards a call about a tenant's batch (id, the upstream's)
// to url, once for every wire: a batch of another tenant is not found.
// On an answer that succeeded, ended reads it and settles the batch when
// the upstream reports it ended.
func (p *Proxy) batchCall(w http.ResponseWriter, r *http.Request, d dialect, provider, tenantID, id, method, url string,
	set func(http.Header), line func(n int) string, ended func(ctx context.Context, batchID string, answer []byte)) {
	batchID, err := p.batches.Find(r.Context(), provider, id, tenantID)
	if err != nil {
		batchFail(w, d, err, line)
		return
	}
	w.Header().Set("X-Tokengate-Batch", batchID)
	status, h, out, err := p.upstreamCall(r.Context(), method, url, "application/json", nil, set, 1<<20)
	if err != nil {
		fail(w, d, problem{code: codeUpstream, message: "the upstream did not answer"})
		return
	}
	if status < 300 {
		ended(r.Context(), batchID, out)
	}
	d.answered(h)
	relayAnswer(w, status, h, out)
}

// refuseBatch refunds a batch the upstream never accepted.
func (p *Proxy) refuseBatch(tenantID, batchID, actor string) {
	ctx, cancel := context.WithTimeout(context.Background(), endTimeout)
	defer cancel()
	if _, err := p.batches.End(ctx, batch.EndParams{TenantID: tenantID, BatchID: batchID, Status: "refused", Actor: actor}); err != nil {
		p.logger.Error("proxy: refused batch not refunded; it expires with its window", "batch", batchID, "error", err.Error())
	}
}

// notFound answers a 404 in d's shape with message.
func notFound(w http.ResponseWriter, d dialect, message string) {
	d.writeError(w, http.StatusNotFound, d.shape(codeNotFound).typ, "", message)
}

// upstreamCall sends one request to a wire's upstream with the wire's
// own key (set), and returns its answer's status and body (at most
// limit bytes).
func (p *Proxy) upstreamCall(ctx context.Context, method, url, contentType string, body []byte, set func(http.Header), limit int64) (int, http.Header, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	set(req.Header)
	resp, err := p.cfg.Client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return 0, nil, nil, err
	}
	return resp.StatusCode, resp.Header, out, nil
}

// relayAnswer relays an upstream's answer as it is.
func relayAnswer(w http.ResponseWriter, status int, h http.Header, body []byte) {
	copyHeaders(w.Header(), h)
	w.Header().Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
