package proxy

import (
	"context"
	"errors"

	"github.com/tokengate/tokengate/estimator"
)

// estimate parses and estimates a call's body under the replica's estimate
// gate, which bounds the bytes every face parses and counts at once: the
// tenant takes its body's bytes first (waiting its turn, within its share),
// and gives them back once the body is estimated, before the upstream is
// called. Past the gate's wait the error is estimator.ErrBusy.
func (p *Proxy) estimate(ctx context.Context, tenantID string, body []byte, parse func([]byte) (*estimator.Request, error)) (*estimator.Request, estimator.Estimate, error) {
	release, err := p.gate.Acquire(ctx, tenantID, int64(len(body)))
	if err != nil {
		return nil, estimator.Estimate{}, err
	}
	defer release()
	req, err := parse(body)
	if err != nil {
		return nil, estimator.Estimate{}, err
	}
	est, err := p.estimator.Estimate(req)
	return req, est, err
}

// notEstimated says whether err is the gate's refusal (or the caller gone
// while it waited) rather than an answer about the request, and counts it.
func (p *Proxy) notEstimated(err error) bool {
	if errors.Is(err, estimator.ErrBusy) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		p.calls.WithLabelValues("busy").Inc()
		return true
	}
	return false
}
