package api_test

// Issue 36, P1: no tenant can end, replay or settle an admission another
// face made. The proxy sends its admission's id to the tenant
// (x-tokengate-admission), and a gateway's ids are in the tenant's ledger;
// the tenant's own key on /v1/admissions/{id}/... must not end them, nor
// its Idempotency-Key reach them. Each test runs the HTTP API and the other
// face on one replica and one store, on a frozen clock, so balances are
// exact.

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	llmproxy "github.com/tokengate/tokengate/api/proxy"
	"github.com/tokengate/tokengate/api/rls"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/await"
	"github.com/tokengate/tokengate/ledger"
)

// setupFaces is the API on a frozen clock with a tenant of 100,000 tokens
// (its key returned); nothing refills.
func setupFaces(t *testing.T) (*apiBundle, string) {
	t.Helper()
	at := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	b := setupAPI(t, func(c *testConfig) { c.Store = account.NewStore(c.DB).WithClock(func() time.Time { return at }) })
	key := b.tenant(t, "acme", rule.Limits{TokensCapacity: 100_000, TokensRateMicro: rule.Micro})
	return b, key
}

// refusedAsOtherFace checks the answer to a tenant's settle or release of
// another face's admission: 409, naming the admission and the face.
func refusedAsOtherFace(t *testing.T, r response, id string, face rule.Face) {
	t.Helper()
	if r.Code != http.StatusConflict {
		t.Fatalf("the tenant ended admission %s of the %s face: %d %s", id, face, r.Code, r.Body.String())
	}
	e := r.errorBody()
	if e.Error.Type != "admission_other_face" || !strings.Contains(e.Error.Message, id) || !strings.Contains(e.Error.Message, string(face)) {
		t.Fatalf("error: %+v", e.Error)
	}
}

// mustAdmission reads an admission of acme.
func (b *apiBundle) mustAdmission(t *testing.T, id string) *account.Admission {
	t.Helper()
	a, err := b.store.AdmissionGet(ctx, "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// exactBalance checks acme's balance is its 100,000 tokens less exactly
// spent, and that its ledger recomputes it.
func (b *apiBundle) exactBalance(t *testing.T, spent int64) {
	t.Helper()
	micro, _ := b.balance(t, "acme")
	if want := (100_000 - spent) * rule.Micro; micro != want {
		t.Fatalf("balance %d micro-tokens, want %d (100,000 less the %d spent)", micro, want, spent)
	}
	if _, err := ledger.Verify(ctx, b.pool, "acme"); err != nil {
		t.Fatal(err)
	}
}

// chatStream is the proxy call of the tests: a stream allowed 5,000 output
// tokens.
const chatStream = `{"model":"gpt-4o","stream":true,"max_tokens":5000,"messages":[{"role":"user","content":"Write the platform team a long story."}]}`

const streamUsage = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":2000,"completion_tokens":4000,"total_tokens":6000}}`

// TestTenantCannotEndTheProxysStreamMidway: the tenant reads the
// admission id from the proxy's answer headers while the stream runs, and
// releases, then settles, that admission with its own key on the HTTP API:
// both are refused (409, naming the admission and its face), nothing
// moves, and the proxy's settle at the stream's end charges the 6,000
// tokens the upstream reported (on the code before the fix, the release
// refunded the estimate, the proxy's settle failed as a conflict, and the
// stream cost 0).
func TestTenantCannotEndTheProxysStreamMidway(t *testing.T) {
	t.Parallel()
	b, key := setupFaces(t)
	resume := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: %s\n\n", `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":"Once"},"finish_reason":null}]}`)
		w.(http.Flusher).Flush()
		<-resume // mid-stream: the tenant acts now
		fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", streamUsage)
	}))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	px := httptest.NewServer(llmproxy.New(b.rep, llmproxy.Config{Upstream: upURL}))
	t.Cleanup(px.Close)

	req, _ := http.NewRequest(http.MethodPost, px.URL+"/v1/chat/completions", strings.NewReader(chatStream))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		close(resume)
		t.Fatal(err)
	}
	defer resp.Body.Close()
	id := resp.Header.Get("X-Tokengate-Admission")
	first, err := bufio.NewReader(resp.Body).ReadString('\n') // the stream is running
	if err != nil || resp.StatusCode != http.StatusOK || id == "" || !strings.HasPrefix(first, "data: ") {
		close(resume)
		t.Fatalf("stream: %d %q %q %v", resp.StatusCode, id, first, err)
	}
	estimate := b.mustAdmission(t, id).Estimate.Cost
	b.exactBalance(t, estimate) // reserved
	release := b.call(t, key, http.MethodPost, "/v1/admissions/"+id+"/release", "")
	settle := b.call(t, key, http.MethodPost, "/v1/admissions/"+id+"/settle", `{"usage":{"prompt_tokens":1,"completion_tokens":0}}`)
	close(resume)
	refusedAsOtherFace(t, release, id, rule.FaceProxy)
	refusedAsOtherFace(t, settle, id, rule.FaceProxy)

	if _, err := bufio.NewReader(resp.Body).ReadString(0); err == nil {
		t.Fatal("the stream did not end")
	}
	// The proxy settles after the last byte is relayed.
	var a *account.Admission
	await.For(10*time.Second, 0, func() bool { a = b.mustAdmission(t, id); return a.State != account.StateReserved })
	want := estimator.Cost(2000, 4000, a.Estimate.InputWeightMicro, a.Estimate.OutputWeightMicro)
	if a.State != account.StateSettled || *a.ActualInput != 2000 || *a.ActualOutput != 4000 || *a.ActualCost != want || a.Face != rule.FaceProxy {
		t.Fatalf("the proxy's admission: %+v", a)
	}
	b.exactBalance(t, want)
}

// TestTenantCannotReachTheProxysCallByIdempotencyKey: a non-streamed proxy
// call with an Idempotency-Key, and the same key and body sent to the HTTP
// API while it runs: the API admits a request of its own (on the code
// before the fix, it answered the proxy's admission as a replay, and the
// tenant released it), and the proxy's admission is settled from the
// upstream's usage.
func TestTenantCannotReachTheProxysCallByIdempotencyKey(t *testing.T) {
	t.Parallel()
	b, key := setupFaces(t)
	resume := make(chan struct{})
	called := make(chan struct{}, 1) // the proxy calls its upstream after its admission is made
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case called <- struct{}{}:
		default:
		}
		<-resume
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":300,"completion_tokens":700,"total_tokens":1000}}`)
	}))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	px := httptest.NewServer(llmproxy.New(b.rep, llmproxy.Config{Upstream: upURL}))
	t.Cleanup(px.Close)

	body := chat(2000, "Say hello to the platform team.")
	type answer struct {
		code int
		id   string
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, px.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Idempotency-Key", "call-7")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- answer{err: err}
			return
		}
		resp.Body.Close()
		done <- answer{code: resp.StatusCode, id: resp.Header.Get("X-Tokengate-Admission")}
	}()
	// The proxy's admission, made before its upstream call.
	var proxyID string
	select {
	case <-called:
	case a := <-done:
		close(resume)
		t.Fatalf("the proxy answered (%+v) without calling its upstream", a)
	case <-time.After(30 * time.Second): // a stalled machine's first estimate and admission
		close(resume)
		t.Fatal("the proxy never called its upstream in 30 s")
	}
	if as, err := b.store.AdmissionRecent(ctx, "acme", 10); err == nil && len(as) == 1 {
		proxyID = as[0].ID
	} else {
		close(resume)
		t.Fatalf("the proxy's admission, made before its upstream call: %+v %v", as, err)
	}
	r := b.call(t, key, http.MethodPost, "/v1/admissions", body, "Idempotency-Key", "call-7")
	var own struct {
		ID string `json:"id"`
	}
	if r.Code == http.StatusCreated {
		r.json(&own)
	}
	if r.Code != http.StatusCreated || own.ID == proxyID || r.Header().Get("Idempotent-Replayed") != "" {
		close(resume)
		t.Fatalf("the API's admission with the proxy's key: %d %s (the proxy's is %s)", r.Code, r.Body.String(), proxyID)
	}
	refusedAsOtherFace(t, b.call(t, key, http.MethodPost, "/v1/admissions/"+proxyID+"/release", ""), proxyID, rule.FaceProxy)
	// The tenant's own admission is its to end.
	if rel := b.call(t, key, http.MethodPost, "/v1/admissions/"+own.ID+"/release", ""); rel.Code != http.StatusOK {
		close(resume)
		t.Fatalf("release of the tenant's own admission: %d %s", rel.Code, rel.Body.String())
	}
	close(resume)
	got := <-done
	if got.err != nil || got.code != http.StatusOK || got.id != proxyID {
		t.Fatalf("proxy call: %+v", got)
	}
	a := b.mustAdmission(t, proxyID)
	want := estimator.Cost(300, 700, a.Estimate.InputWeightMicro, a.Estimate.OutputWeightMicro)
	if a.State != account.StateSettled || *a.ActualCost != want {
		t.Fatalf("the proxy's admission: %+v", a)
	}
	b.exactBalance(t, want)
}

// gateway serves the rate limit service of b's replica on a real TCP
// listener, as Envoy reaches it, and returns a caller with a gateway
// credential scoped to acme.
func gateway(t *testing.T, b *apiBundle) func(hits uint32, d *ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(rls.ServerOptions()...)
	rlsv3.RegisterRateLimitServiceServer(gs, rls.New(b.rep))
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	_, secret, err := credential.GatewayCreate(ctx, b.pool, "envoy-1", []string{"acme"})
	if err != nil {
		t.Fatal(err)
	}
	client := rlsv3.NewRateLimitServiceClient(conn)
	return func(hits uint32, d *ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		cctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+secret)
		r, err := client.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}, HitsAddend: hits})
		if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("gateway call: %v %v", r, err)
		}
		return r
	}
}

func entries(kv ...string) []*ratelimitv3.RateLimitDescriptor_Entry {
	var es []*ratelimitv3.RateLimitDescriptor_Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

// TestTenantCannotEndAGatewaysAdmission: a gateway's request reserves
// 50,000 hits; the tenant finds the admission's id in its own ledger and
// releases it with its own key: refused (409), and the stream-end call
// settles the 42,000 hits used (on the code before the fix, the release
// refunded them all and the stream end found it ended: the call cost 0).
func TestTenantCannotEndAGatewaysAdmission(t *testing.T) {
	t.Parallel()
	b, key := setupFaces(t)
	call := gateway(t, b)
	call(50_000, &ratelimitv3.RateLimitDescriptor{Entries: entries("tenant", "acme", "request_id", "req-1")})

	r := b.call(t, key, http.MethodGet, "/v1/ledger?kind=reserve", "")
	var page struct {
		Entries []struct {
			AdmissionID string `json:"admission_id"`
			Actor       string `json:"actor"`
		} `json:"entries"`
	}
	r.json(&page)
	if r.Code != http.StatusOK || len(page.Entries) != 1 || page.Entries[0].AdmissionID == "" {
		t.Fatalf("the tenant's ledger: %d %s", r.Code, r.Body.String())
	}
	id := page.Entries[0].AdmissionID
	refusedAsOtherFace(t, b.call(t, key, http.MethodPost, "/v1/admissions/"+id+"/release", ""), id, rule.FaceRLS)
	refusedAsOtherFace(t, b.call(t, key, http.MethodPost, "/v1/admissions/"+id+"/settle", `{"usage":{"prompt_tokens":0,"completion_tokens":0}}`), id, rule.FaceRLS)
	b.exactBalance(t, 50_000)

	call(0, &ratelimitv3.RateLimitDescriptor{Entries: entries("tenant", "acme", "request_id", "req-1", "phase", "response"),
		HitsAddend: wrapperspb.UInt64(42_000)})
	if a := b.mustAdmission(t, id); a.State != account.StateSettled || *a.ActualCost != 42_000 || a.Face != rule.FaceRLS {
		t.Fatalf("the gateway's admission: %+v", a)
	}
	b.exactBalance(t, 42_000)
}

// TestGatewayKeysLiveInTheirOwnNamespace: the tenant sends the API an
// Idempotency-Key spelled as a gateway's ("rls:<request id>"), before and
// after the gateway's request of that id: the API's admission and the
// gateway's never meet. The gateway's stream end settles its own
// admission, never the tenant's (on the code before the fix, it settled
// the tenant's API admission, and the API's retry with the key after the
// gateway's was a mismatch, or a replay of the gateway's admission).
func TestGatewayKeysLiveInTheirOwnNamespace(t *testing.T) {
	t.Parallel()
	b, key := setupFaces(t)
	call := gateway(t, b)
	small := chat(10, "hi")
	api := func(idem string) string {
		t.Helper()
		r := b.call(t, key, http.MethodPost, "/v1/admissions", small, "Idempotency-Key", idem)
		var out struct {
			ID string `json:"id"`
		}
		r.json(&out)
		if r.Code != http.StatusCreated || r.Header().Get("Idempotent-Replayed") != "" {
			t.Fatalf("the API's admission with key %s: %d %s", idem, r.Code, r.Body.String())
		}
		return out.ID
	}
	// Before the gateway's request.
	early := api("rls:req-9")
	call(30_000, &ratelimitv3.RateLimitDescriptor{Entries: entries("tenant", "acme", "request_id", "req-9")})
	// After it.
	late := api("rls:req-9x")
	call(20_000, &ratelimitv3.RateLimitDescriptor{Entries: entries("tenant", "acme", "request_id", "req-9x")})
	call(0, &ratelimitv3.RateLimitDescriptor{Entries: entries("tenant", "acme", "request_id", "req-9", "phase", "response"),
		HitsAddend: wrapperspb.UInt64(25_000)})
	call(0, &ratelimitv3.RateLimitDescriptor{Entries: entries("tenant", "acme", "request_id", "req-9x", "phase", "response"),
		HitsAddend: wrapperspb.UInt64(15_000)})

	for _, id := range []string{early, late} {
		if a := b.mustAdmission(t, id); a.State != account.StateReserved || a.Face != rule.FaceAPI {
			t.Fatalf("the tenant's API admission %s was ended by the gateway: %+v", id, a)
		}
	}
	var gw []account.Admission
	as, err := b.store.AdmissionRecent(ctx, "acme", 10)
	if err != nil {
		t.Fatal(err)
	}
	var apiCost int64
	for _, a := range as {
		switch a.Face {
		case rule.FaceRLS:
			gw = append(gw, *a)
		case rule.FaceAPI:
			apiCost += a.Estimate.Cost
		}
	}
	if len(gw) != 2 || gw[0].State != account.StateSettled || gw[1].State != account.StateSettled || *gw[0].ActualCost+*gw[1].ActualCost != 40_000 {
		t.Fatalf("the gateway's admissions: %+v", gw)
	}
	// A retry of the API's key is the API's own admission again.
	r := b.call(t, key, http.MethodPost, "/v1/admissions", small, "Idempotency-Key", "rls:req-9")
	var again struct {
		ID string `json:"id"`
	}
	r.json(&again)
	if r.Code != http.StatusCreated || again.ID != early || r.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of the API's key: %d %s", r.Code, r.Body.String())
	}
	b.exactBalance(t, 40_000+apiCost)
}
