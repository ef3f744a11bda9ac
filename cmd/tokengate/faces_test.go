package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// TestEveryFaceCountsItsRefusals runs a whole replica as `serve` wires it
// (API, proxy and rate limit service on one replica) and refuses one
// tenant only through the proxy and another only through the rate limit
// service. Each face's admissions, refusals and settles move the replica's
// one set of counters, labelled by face, and its refusals reach the
// dashboard's tally, from which each tenant's throttled alert is raised
// exactly once: the refusals of every face count as the API's do.
func TestEveryFaceCountsItsRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":800,"total_tokens":810}}`)
	}))
	t.Cleanup(up.Close)
	dbURL := pgtest.EmptyURL(t)
	addr, proxyAddr, rlsAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	const alertKey = "0123456789abcdef0123456789abcdef"
	stop := startServe(t, []string{"serve", "--database-url", dbURL, "--migrate", "--addr", addr, "--proxy-addr", proxyAddr, "--upstream", up.URL,
		"--rls-addr", rlsAddr, "--alert-key", alertKey, "--log-level", "error"}, "http://"+addr+"/readyz")

	pool := pgtest.Pool(t, dbURL, nil)
	store := account.NewStore(pool)
	for _, id := range []string{"px", "rl"} {
		if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: rule.Limits{TokensCapacity: 1000, TokensRateMicro: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	_, key, err := credential.KeyCreate(ctx, pool, "px")
	if err != nil {
		t.Fatal(err)
	}
	_, gateway, err := credential.GatewayCreate(ctx, pool, "envoy", []string{"rl"})
	if err != nil {
		t.Fatal(err)
	}
	alerts := alert.NewStore(pool, []byte(alertKey))
	ep, _, err := alerts.CreateEndpoint(ctx, "https://example.com/hook", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"px", "rl"} {
		if _, err := alerts.CreateRule(ctx, alert.RuleParams{TenantID: id, EndpointID: ep.ID, Kind: alert.KindThrottled, Limit: "tokens", SustainMinutes: 1}); err != nil {
			t.Fatal(err)
		}
	}

	// Through the proxy: one call admitted and settled (810 of 1000), then
	// refusals.
	const refusals = 4
	proxyCalls := map[int]int{}
	for range 1 + refusals {
		req, _ := http.NewRequest(http.MethodPost, "http://"+proxyAddr+"/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-4o","max_tokens":800,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		proxyCalls[resp.StatusCode]++
	}
	if proxyCalls[http.StatusOK] != 1 || proxyCalls[http.StatusTooManyRequests] != refusals {
		t.Fatalf("proxy answers: %v", proxyCalls)
	}

	// Through the rate limit service: a request reserved and settled at
	// stream end, then refusals.
	conn, err := grpc.NewClient(rlsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := rlsv3.NewRateLimitServiceClient(conn)
	gctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+gateway)
	shouldRateLimit := func(hits uint32, kv ...string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		d := &ratelimitv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		resp, err := client.ShouldRateLimit(gctx, &rlsv3.RateLimitRequest{Domain: "tokengate", HitsAddend: hits, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode
	}
	if c := shouldRateLimit(900, "tenant", "rl", "request_id", "r0"); c != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first reserve: %v", c)
	}
	if c := shouldRateLimit(850, "tenant", "rl", "request_id", "r0", "phase", "response"); c != rlsv3.RateLimitResponse_OK {
		t.Fatalf("stream-end settle: %v", c)
	}
	for i := range refusals {
		if c := shouldRateLimit(900, "tenant", "rl", "request_id", fmt.Sprintf("r%d", i+1)); c != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("reserve %d: %v, want OVER_LIMIT", i+1, c)
		}
	}

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, face := range []string{"proxy", "rls"} {
		for _, line := range []string{
			fmt.Sprintf(`tokengate_admissions_total{face=%q,limit="",outcome="admitted"} 1`, face),
			fmt.Sprintf(`tokengate_admissions_total{face=%q,limit="tokens",outcome="rejected"} %d`, face, refusals),
			fmt.Sprintf(`tokengate_settlements_total{face=%q,kind="settle",outcome="applied"} 1`, face),
		} {
			if !strings.Contains(string(raw), "\n"+line+"\n") {
				t.Errorf("/metrics lacks %s", line)
			}
		}
	}

	// Stopping the replica flushes its last tallies; the throttled rules
	// are then evaluated as any replica does, after the minute of the
	// refusals.
	stop()
	for _, id := range []string{"px", "rl"} {
		var minute time.Time
		var refused int64
		if err := pool.QueryRow(ctx, `SELECT max(minute), sum(count) FROM rejection_counts WHERE tenant_id = $1 AND NOT shadow`, id).Scan(&minute, &refused); err != nil {
			t.Fatalf("%s's tally: %v", id, err)
		}
		if refused != refusals {
			t.Errorf("%s: the tally holds %d refusals, want %d", id, refused, refusals)
		}
		if _, err := alerts.RaiseThrottled(ctx, minute.Add(time.Minute+time.Second)); err != nil {
			t.Fatal(err)
		}
		events, err := alerts.Events(ctx, alert.EventFilter{TenantID: id})
		if err != nil {
			t.Fatal(err)
		}
		if len(events) != 1 || events[0].Type != alert.TypeThrottled {
			t.Errorf("%s: events %+v, want one %s", id, events, alert.TypeThrottled)
		}
	}
}
