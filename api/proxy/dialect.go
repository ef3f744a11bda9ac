package proxy

import (
	"bytes"
	"context"
	"net/http"
	"net/url"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// dialect is one wire the proxy serves (OpenAI's, Anthropic's): all that
// differs between providers' APIs, from where the tenant's key is to how
// usage is read from a stream. The path (path.go) is the rest, once for
// every wire: authentication, the key's rule, the estimate gate, the
// estimate, the reservation, the upstream call, the relay, the settle or
// release, and the counting. A new wire (Gemini's: its key in
// x-goog-api-key or ?key=, its model in the URL's path, its usage in
// usageMetadata) is a new dialect in its own files, listed in New; the
// path does not change.
//
// A dialect translates and never estimates nor prices: parse turns the
// body into an *estimator.Request, and the path hands it to the admission
// use case (admission.Admitter.Admit estimates, prices and reserves it;
// Quote estimates a count route's). A stream that reports no usage counts
// its streamed text through the outputCounter stream is given (the use
// case's CountOutput), never with the estimator itself, and the path
// settles through the use case, which bounds and prices the usage. The
// integration layout test refuses a face that calls the estimator.
type dialect interface {
	// route is r's endpoint on this wire; false if the wire serves none
	// (r's path alone decides: its model may be in it).
	route(r *http.Request) (route, bool)
	// upstream is the wire's upstream in cfg, nil when the proxy serves
	// none: its routes are then answered codeNotFound.
	upstream(cfg *Config) *url.URL
	// key is the tenant's key as r carries it on this wire.
	key(r *http.Request) string
	// parse reads a body of rt (and what of r the wire reads: a header, the
	// model in the path) for the estimator. An *estimator.InvalidError
	// names what is wrong.
	parse(rt route, r *http.Request, body []byte) (*estimator.Request, error)
	// prepare is the body to forward for an admitted body of rt: the wire
	// may ask the upstream for what it settles from (setting rt.added),
	// and refuse options it cannot settle (an *estimator.InvalidError).
	prepare(rt *route, body []byte) ([]byte, error)
	// count answers a route of rt.count (Anthropic's count_tokens) from
	// its estimate (the use case's quote of what parse read), or as the
	// wire's upstream answers it.
	count(p *Proxy, w http.ResponseWriter, r *http.Request, body []byte, est estimator.Estimate)
	// request is the upstream request for r, with body: the URL, and the
	// headers (the wire's own key for the upstream, never the tenant's).
	request(ctx context.Context, cfg *Config, r *http.Request, body []byte) (*http.Request, error)
	// provider is the wire's gen_ai.provider.name.
	provider() string
	// answered edits the upstream's answer headers before they are
	// relayed (the upstream's own rate limit headers are its account's,
	// not the tenant's).
	answered(h http.Header)
	// usage reads the usage of a whole answer of rt, as reported (Clamp
	// is the path's); false if it reports none.
	usage(rt route, body []byte) (rule.Usage, bool)
	// framing is how an answer of rt with headers h is streamed (sse.go):
	// nil for a whole answer, read by usage.
	framing(rt route, h http.Header) framing
	// stream reads a streamed answer of rt, reserved as est; out counts
	// the output streamed when the stream reports no usage.
	stream(rt route, est estimator.Estimate, out outputCounter) streamReader

	// shape is how a problem of code c looks on the wire.
	shape(c code) shape
	// writeError writes the wire's error body: param is the request's
	// field at fault ("" when none).
	writeError(w http.ResponseWriter, status int, typ, param, message string)
	// rateHeaders sets the wire's rate limit headers from the tenant's
	// snapshot, on an admission and on a refusal.
	rateHeaders(h http.Header, snap rule.Snapshot)
	// exhaustedHeaders sets the wire's own headers for an exhausted
	// budget window, besides the ones every wire sets
	// (setExhaustedHeaders).
	exhaustedHeaders(h http.Header, e *rule.BudgetExhaustedError)
}

// outputCounter counts the text a stream wrote as the estimate of its
// request counted its texts (admission.Admitter.CountOutput: the estimate
// carries the factor of a wire without an offline tokenizer, so no wire
// needs a counting rule of its own). The path gives a dialect's stream the
// replica's Admitter.
type outputCounter interface {
	CountOutput(est estimator.Estimate, text string) int64
}

// route is one endpoint of a wire, as its dialect routed a call.
type route struct {
	// op is the call's gen_ai.operation.name: chat, text_completion,
	// embeddings.
	op string
	// api is which of the wire's APIs the call is, in the wire's own
	// numbering: the path never reads it.
	api int
	// count: the route is answered from the estimate alone
	// (dialect.count), never admitted nor debited.
	count bool
	// added: prepare asked the upstream for usage the client did not ask
	// for, which the wire's stream reader keeps from the client.
	added bool
	// unserved: the path is of the wire's API but no route the proxy
	// serves (Gemini's models list, a method it does not admit), answered
	// codeUnserved in the wire's shape rather than another wire's.
	unserved bool
}

// streamReader reads one streamed answer, event by event, for its
// usage.
type streamReader interface {
	// event reads one event's data. forward says whether it goes on to
	// the client; final, that the stream's usage is now known in full:
	// the path settles before the event is relayed, so that a client that
	// saw its stream end sees the budget settled.
	event(data []byte) (forward, final bool)
	// usage is the stream's usage so far: as reported when it finished,
	// else (it broke, or its client left) with the output streamed so far
	// counted as the estimate counts.
	usage() rule.Usage
	// silent says whether a stream that ended without its final event was
	// broken off by the upstream without an error event: the path then
	// breaks the client's connection too, so that its SDK reports a broken
	// stream rather than a short answer.
	silent() bool
}

// newUpstreamRequest is a POST of body to r's path and query on base: the
// request every wire whose upstream mirrors its routes builds.
func newUpstreamRequest(ctx context.Context, base *url.URL, r *http.Request, body []byte) (*http.Request, error) {
	target := base.JoinPath(r.URL.Path)
	target.RawQuery = r.URL.RawQuery
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}
