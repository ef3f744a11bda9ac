//go:build cluster && soak

package cluster_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The soak's clients of the two other faces: the proxy's OpenAI wire, in
// front of the emulated upstream (provider_test.go; its Gemini wire's
// clients are soak_gemini_test.go's), and Envoy's rate limit service. They admit against the same tenants as the API's clients, and
// the checker holds every admission to the same model (model_test.go).

// prompts is how many chat prompts the proxy's clients choose from; their
// input tokens are measured once (measurePrompts), so that the checker
// knows each call's estimate.
const prompts = 8

// chatBody is a chat completion call for prompt p. user names the call:
// the proxy forwards the body as it is, and the upstream answers by it.
func chatBody(p int, maxTokens int64, user string, stream, askUsage bool) string {
	extra := ""
	if stream {
		extra = `,"stream":true`
		if askUsage {
			extra += `,"stream_options":{"include_usage":true}`
		}
	}
	return fmt.Sprintf(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":%q}],"max_tokens":%d,"user":%q%s}`,
		strings.Repeat("soak ", p+1), maxTokens, user, extra)
}

// measurePrompts asks the API for the estimate of each prompt
// (POST /v1/estimate debits nothing) and returns its input tokens. It
// fails the test unless a cost is input plus output tokens, which the
// checker assumes of the soak's model.
func measurePrompts(t *testing.T, url, key string) []int64 {
	t.Helper()
	var in []int64
	for p := range prompts {
		code, _, v := call("POST", url+"/v1/estimate", key, "", chatBody(p, 7, "probe", false, false))
		if code != http.StatusOK || v.Estimate.Cost != v.Estimate.InputTokens+7 || v.Estimate.OutputTokens != 7 {
			t.Fatalf("the estimate of prompt %d: %d %+v", p, code, v)
		}
		in = append(in, v.Estimate.InputTokens)
	}
	return in
}

// proxyClient is a frontend behind the OpenAI proxy: chat completions,
// streamed or not, with an Idempotency-Key (retrying errors with it) or
// without. The upstream answers each as the client planned: usage below
// or at what was reserved, more output than reserved (the proxy clamps
// it), absurd usage (clamped to the model's window), no usage at all (the
// estimate stands), or a 500 before any output (released). Streams always
// report usage: the proxy asks for it whether the client did or not.
func (w *workload) proxyClient(r *rand.Rand, id int, stop <-chan struct{}) {
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		tenant := w.names[r.IntN(len(w.names))]
		p, maxOut := r.IntN(prompts), int64(1+r.IntN(300))
		stream := r.IntN(3) == 0
		asked := stream && r.IntN(2) == 0
		callID := fmt.Sprintf("p%d-%d", id, n)
		in := w.promptTokens[p]
		plan := providerPlan{usage: true, in: in + int64(r.IntN(3)), out: int64(r.IntN(int(maxOut) + 1))}
		switch x := r.IntN(200); {
		case x < 25:
			plan.fail = true
		case x < 35 && !stream:
			plan.usage = false
		case x < 50:
			plan.out = maxOut + 1 + int64(r.IntN(20))
		case x < 51:
			plan.in, plan.out = 900_000_000, 900_000_000
		}
		if r.IntN(4) == 0 {
			plan.delay = time.Duration(r.IntN(300)) * time.Millisecond
		}
		w.provider.plan(callID, plan)
		idem := ""
		if r.IntN(3) > 0 {
			idem = callID
		}
		body := chatBody(p, maxOut, callID, stream, asked)
		seen := proxySeen{call: callID, in: in, maxOut: maxOut, stream: stream, askedUsage: asked}
		for attempt := 0; attempt < 4; attempt++ {
			e := event{face: faceProxy, client: id, op: "call", tenant: tenant, key: proxyKey(idem), body: body, begin: time.Since(w.h.start), reservedCost: in + maxOut}
			rep := w.pick(r)
			e.replica = rep.name
			e.code, e.typ, e.admission, e.retryAfter, e.proxy = proxyCall(rep.proxyURL, w.keys[tenant], idem, body, seen)
			e.end = time.Since(w.h.start)
			w.h.add(e)
			if e.admission != "" || idem == "" || e.code != 0 && e.code < 500 {
				break // told of an admission, refused, or not to be retried
			}
			clientPause(100 * time.Millisecond)
		}
	}
}

// proxyCall sends one chat completion and reads what the client sees: the
// status, an error's type, the admission named by X-Tokengate-Admission, a
// refusal's Retry-After and, of a stream, whether it ended ([DONE]) and
// carried a usage chunk.
func proxyCall(url, key, idem, body string, seen proxySeen) (code int, typ, admission, retryAfter string, _ proxySeen) {
	resp, err := send("POST", url+"/v1/chat/completions", key, idem, body)
	if err != nil {
		return 0, "transport: " + err.Error(), "", "", seen
	}
	defer resp.Body.Close()
	admission, retryAfter = resp.Header.Get("X-Tokengate-Admission"), resp.Header.Get("Retry-After")
	if resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			seen.sawDone = seen.sawDone || ok && data == "[DONE]"
			seen.sawUsage = seen.sawUsage || ok && strings.Contains(data, `"usage"`)
		}
		if sc.Err() != nil {
			typ = "stream broken: " + sc.Err().Error()
		}
		return resp.StatusCode, typ, admission, retryAfter, seen
	}
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		typ = "answer broken: " + err.Error()
	}
	var v struct {
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &v) == nil && v.Error.Type != "" {
		typ = v.Error.Type
	}
	return resp.StatusCode, typ, admission, retryAfter, seen
}

// rlsHeld is a request a gateway was told it may run.
type rlsHeld struct {
	tenant, requestID string
	hits              int64
	settled           int64 // the usage its stream end reports, once chosen
	ending            bool  // a stream end was sent: its usage is chosen
	confirmed         bool  // it was answered with a decision (a balance)
}

// rlsClient is a gateway (Envoy) calling the rate limit service: a
// request's call reserves its hits under its request id (retried with the
// same id on errors), and the call at stream end (phase=response) settles
// it with the actual usage: less, as much or more than reserved, absurd
// usage now and then (refused, and the reservation stays open), repeated
// with the same usage or another (the first answer stands). Some streams
// never end (the reservation expires, and a late stream end still
// reconciles); a stream end for a refused request changes nothing; a call
// naming a tenant outside the gateway's scope is refused.
func (w *workload) rlsClient(r *rand.Rand, id int, stop <-chan struct{}) {
	var open, ended, refused []rlsHeld
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		switch x := r.IntN(100); {
		case x < 50 || len(open) == 0:
			a := rlsHeld{tenant: w.names[r.IntN(len(w.names))], requestID: fmt.Sprintf("r%d-%d", id, n), hits: int64(1 + r.IntN(400))}
			if r.IntN(50) == 0 {
				a.tenant = "org" // not in the gateway's scope
			}
			switch w.rlsRetried(r, id, a, false, a.hits).code {
			case http.StatusOK:
				open = append(open, a)
			case http.StatusTooManyRequests:
				refused = append(refused, a)
			}
		case x < 80:
			i := r.IntN(len(open))
			a := &open[i]
			if !a.ending && r.IntN(20) == 0 {
				// Usage no request could produce: refused, nothing moves.
				w.rlsRetried(r, id, *a, true, rlsAbsurdHits)
				break
			}
			if !a.ending {
				// Chosen once: a retry after errors reports the same.
				a.settled, a.ending = []int64{0, a.hits / 2, a.hits, a.hits + 1 + int64(r.IntN(50))}[r.IntN(4)], true
			}
			if e := w.rlsRetried(r, id, *a, true, a.settled); e.code == http.StatusOK {
				a.confirmed = e.rls.decided
				ended = append(ended, *a)
				open = append(open[:i], open[i+1:]...)
			}
		case x < 88 && len(ended) > 0:
			a := ended[r.IntN(len(ended))]
			hits := a.settled
			if a.confirmed && r.IntN(3) == 0 {
				hits++ // other usage, once the first was decided: the first stands
			}
			w.rlsRetried(r, id, a, true, hits)
		case x < 91 && len(refused) > 0:
			w.rlsRetried(r, id, refused[r.IntN(len(refused))], true, 10)
		default:
			// Leave one open: its stream may never end, or end late.
			clientPause(50 * time.Millisecond)
		}
	}
}

// rlsAbsurdHits is usage no request could produce: more than the model's
// context window.
const rlsAbsurdHits = 1_000_000

// rlsRetried sends one call (retrying errors with the same request id, as
// Envoy does) and returns the last answer.
func (w *workload) rlsRetried(r *rand.Rand, client int, a rlsHeld, end bool, hits int64) event {
	op := "reserve"
	if end {
		op = "settle"
	}
	for attempt := 0; ; attempt++ {
		e := event{face: faceRLS, client: client, op: op, tenant: a.tenant, key: rlsKey(a.requestID), begin: time.Since(w.h.start),
			rls: rlsSeen{requestID: a.requestID, hits: hits}}
		if !end {
			e.reservedCost = hits
		}
		rep := w.pick(r)
		e.replica = rep.name
		e.code, e.typ, e.retryAfter, e.rls = w.rls.call(rep.rlsAddr, a.tenant, e.rls, end, r.IntN(2) == 0)
		e.end = time.Since(w.h.start)
		w.h.add(e)
		if e.code != 0 && e.code < 500 || attempt == 3 {
			return e
		}
		clientPause(100 * time.Millisecond)
	}
}

// rlsKey is the idempotency key under which the service reserves a
// request id (api/rls: "rls:" and the id), as the store keeps it, in the
// service's namespace (rule.Face.StoredKey: "rls " before it), by which
// the checker finds its admission.
func rlsKey(requestID string) string { return "rls rls:" + requestID }

// proxyKey is a proxy call's Idempotency-Key as the store keeps it, in the
// proxy's namespace (rule.Face.StoredKey: "proxy " before it; "" for
// none).
func proxyKey(idem string) string {
	if idem == "" {
		return ""
	}
	return "proxy " + idem
}

// rlsClients keeps one gRPC connection a replica address (a replica
// started again has a new one) with the gateway's credential.
type rlsClients struct {
	credential string
	mu         sync.Mutex
	conns      map[string]*grpc.ClientConn
}

func (c *rlsClients) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		_ = conn.Close()
	}
}

func (c *rlsClients) client(addr string) (rlsv3.RateLimitServiceClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	conn, ok := c.conns[addr]
	if !ok {
		var err error
		if conn, err = grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			return nil, err
		}
		c.conns[addr] = conn
	}
	return rlsv3.NewRateLimitServiceClient(conn), nil
}

// call asks as Envoy does: one descriptor (tenant, model, request_id, and
// phase=response at stream end) with its hits, on the descriptor or,
// callHits, on the call. The code is 200 for OK, 429 for OVER_LIMIT, and
// for an error 400 (INVALID_ARGUMENT), 503 (UNAVAILABLE: the store, or the
// connection) or 0 (any other: the outcome is unknown).
func (c *rlsClients) call(addr, tenant string, seen rlsSeen, end, callHits bool) (code int, typ, retryAfter string, _ rlsSeen) {
	cl, err := c.client(addr)
	if err != nil {
		return 0, err.Error(), "", seen
	}
	d := desc("tenant", tenant, "model", "gpt-4o-mini", "request_id", seen.requestID)
	req := &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
	switch {
	case end:
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "phase", Value: "response"})
		d.HitsAddend = wrapperspb.UInt64(uint64(seen.hits)) // 0 is usage too
	case callHits:
		req.HitsAddend = uint32(seen.hits)
	default:
		d.HitsAddend = wrapperspb.UInt64(uint64(seen.hits))
	}
	cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.credential), 15*time.Second)
	defer cancel()
	resp, err := cl.ShouldRateLimit(cctx, req)
	switch status.Code(err) {
	case codes.OK:
	case codes.InvalidArgument:
		return http.StatusBadRequest, err.Error(), "", seen
	case codes.Unavailable:
		return http.StatusServiceUnavailable, err.Error(), "", seen
	default:
		return 0, err.Error(), "", seen
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == "retry-after" {
			retryAfter = h.GetValue()
		}
	}
	if st := resp.GetStatuses(); len(st) == 1 && st[0].GetCurrentLimit() != nil {
		seen.decided, seen.remaining = true, int64(st[0].GetLimitRemaining())
	}
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		return http.StatusTooManyRequests, "over_limit", retryAfter, seen
	}
	return http.StatusOK, "", retryAfter, seen
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}
