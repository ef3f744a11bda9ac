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

// serveBatch serves the batch routes of the wires whose upstream is set,
// and says whether r was one.
func (p *Proxy) serveBatch(w http.ResponseWriter, r *http.Request) bool {
	if p.batches == nil {
		return false
	}
	if p.cfg.Upstream != nil && p.serveOpenAIBatch(w, r) {
		return true
	}
	return p.cfg.AnthropicUpstream != nil && p.serveAnthropicBatch(w, r)
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
