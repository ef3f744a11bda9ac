package proxy

import (
	"errors"
	"net/http"

	"github.com/tokengate/tokengate/estimator"
)

// gate takes a call's body bytes of the replica's estimate gate, which
// bounds the bytes every face reads, parses and counts at once: before the
// body is read (its Content-Length, or the body limit when it is sent in
// chunks), so that the callers waiting their turn hold no memory, within
// the tenant's share. The caller gives them back once the body is
// estimated, before the upstream is called. Past the gate's wait the
// error is estimator.ErrBusy.
func (p *Proxy) gate(r *http.Request, tenantID string) (release func(), err error) {
	n := p.cfg.BodyLimit
	if r.ContentLength >= 0 {
		n = min(r.ContentLength, n)
	}
	release, err = p.estimates.Acquire(r.Context(), tenantID, n)
	if err != nil {
		// Past the wait, or the caller gone while it waited (whom no
		// answer reaches, and who is not a server error).
		return nil, estimator.ErrBusy
	}
	return release, nil
}

// notEstimated says whether err is the gate's refusal rather than an
// answer about the request, and counts it.
func (p *Proxy) notEstimated(err error) bool {
	if errors.Is(err, estimator.ErrBusy) {
		p.calls.WithLabelValues("busy").Inc()
		return true
	}
	return false
}
