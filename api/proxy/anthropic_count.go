package proxy

import (
	"encoding/json"
	"io"
	"net/http"

	"github.com/tokengate/tokengate/estimator"
)

// count answers count_tokens with the estimate's input, as Anthropic's
// {"input_tokens": N}, or with the upstream's own count when
// Config.CountTokensUpstream says so. The path has checked the body
// either way: a call the estimator refuses never reaches the upstream.
// Nothing is admitted or debited. X-Tokengate-Count says which count
// answered.
func (anthropic) count(p *Proxy, w http.ResponseWriter, r *http.Request, body []byte, est estimator.Estimate) {
	if p.cfg.CountTokensUpstream && p.countTokensUpstream(w, r, body) {
		return
	}
	w.Header().Set("X-Tokengate-Count", "estimate")
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		InputTokens int64 `json:"input_tokens"`
	}{est.InputTokens})
}

// countTokensUpstream forwards a count_tokens call to Anthropic, with the
// headers a Messages call passes and tokengate's key, and relays its
// answer. It answers false, having written nothing, when the upstream
// cannot answer (no connection, a 5xx, a 429): Claude Code counts tokens
// to decide when to compact, and an estimate serves it better than an
// error. A 4xx other than 429 is the call's own fault and is relayed.
func (p *Proxy) countTokensUpstream(w http.ResponseWriter, r *http.Request, body []byte) bool {
	ureq, err := anthropic{}.request(r.Context(), &p.cfg, r, body)
	if err != nil {
		return false
	}
	resp, err := p.cfg.Client.Do(ureq)
	if err != nil {
		p.logger.Warn("count_tokens upstream did not answer: answered with the estimate", "error", err.Error())
		return false
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
		p.logger.Warn("count_tokens upstream failed: answered with the estimate", "status", resp.StatusCode)
		return false
	}
	dropUpstreamRateHeaders(resp.Header)
	copyHeaders(w.Header(), resp.Header)
	w.Header().Del("Content-Length")
	w.Header().Set("X-Tokengate-Count", "upstream")
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(out)
	return true
}
