package proxy

import (
	"net/http"
	"strings"

	"github.com/tokengate/tokengate/estimator"
)

// withContext1M is req estimated with its model's widest window when the
// call carries Anthropic's 1M-context beta (anthropic-beta:
// context-1m-2025-08-07, among other betas or alone, in one header or
// several): the header goes upstream as it is, and the call is served up
// to 1M tokens, so its estimate must not be refused at the standard
// window. (The settle's usage bound is the model's widest window for
// every call: account.SettleBounds.) A model without the beta keeps its
// window: Anthropic ignores the beta for it.
func withContext1M(req *estimator.Request, r *http.Request) *estimator.Request {
	if req == nil {
		return req
	}
	for _, v := range r.Header.Values("Anthropic-Beta") {
		for beta := range strings.SplitSeq(v, ",") {
			if strings.HasPrefix(strings.ToLower(strings.TrimSpace(beta)), "context-1m-") {
				return req.WithContext1M()
			}
		}
	}
	return req
}
