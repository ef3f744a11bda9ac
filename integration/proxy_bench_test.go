package integration_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/api/proxy"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// fastUpstream answers like OpenAI at once: a whole chat completion, or a
// stream of ten chunks and the usage chunk.
func fastUpstream(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if !bytes.Contains(body, []byte(`"stream":true`)) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Check the concurrency limit first."},"finish_reason":"stop"}],"usage":{"prompt_tokens":120,"completion_tokens":8,"total_tokens":128}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range 10 {
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"word%d \"}}]}\n\n", i)
		w.(http.Flusher).Flush()
	}
	fmt.Fprint(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":20,\"total_tokens\":140}}\n\ndata: [DONE]\n\n")
}

// BenchmarkProxyAddedLatency measures what the OpenAI-compatible proxy adds
// to a call: the same request straight to a fast emulated upstream and
// through the proxy (authenticate, estimate, reserve in Postgres, forward,
// settle in Postgres), alternated in one run, one caller at a time and 16
// at once. It reports each path's p50 and p99 and the difference.
//
//	make bench-proxy
func BenchmarkProxyAddedLatency(b *testing.B) {
	pool := pgtest.Pool(b, pgtest.URL(b), func(c *pgxpool.Config) { c.MaxConns = 32 })
	store := account.NewStore(pool)
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{
		TokensCapacity: 1_000_000_000_000, TokensRateMicro: 1_000_000 * rule.Micro}}); err != nil {
		b.Fatal(err)
	}
	_, key, err := credential.KeyCreate(ctx, pool, "acme")
	if err != nil {
		b.Fatal(err)
	}
	up := httptest.NewServer(http.HandlerFunc(fastUpstream))
	defer up.Close()
	upURL, _ := url.Parse(up.URL)
	rep, err := replica.New(replica.Config{DB: pool, Store: store, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer rep.Close()
	p := proxy.New(rep, proxy.Config{Upstream: upURL, UpstreamKey: "sk-upstream"})
	px := httptest.NewServer(p)
	defer px.Close()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

	for _, mode := range []struct {
		name   string
		stream bool
	}{{"chat", false}, {"stream", true}} {
		body := bytes.Replace(benchBody, []byte(`"max_tokens":256,`), []byte(`"max_tokens":256,"stream":true,`), 1)
		if !mode.stream {
			body = benchBody
		}
		call := func(base string) time.Duration {
			req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+key)
			req.Header.Set("Content-Type", "application/json")
			start := time.Now()
			resp, err := hc.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body) // the whole answer, the last event included
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("%s: %d", base, resp.StatusCode)
			}
			return time.Since(start)
		}
		for _, callers := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/callers=%d", mode.name, callers), func(b *testing.B) {
				var mu sync.Mutex
				var direct, proxied []time.Duration
				var wg sync.WaitGroup
				per := max(1, b.N/callers)
				b.ResetTimer()
				for range callers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range per {
							d, q := call(up.URL), call(px.URL)
							mu.Lock()
							direct, proxied = append(direct, d), append(proxied, q)
							mu.Unlock()
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				slices.Sort(direct)
				slices.Sort(proxied)
				pct := func(ds []time.Duration, q float64) float64 {
					return float64(ds[min(len(ds)-1, int(q*float64(len(ds))))].Microseconds()) / 1000
				}
				b.ReportMetric(pct(direct, 0.50), "direct_p50_ms")
				b.ReportMetric(pct(direct, 0.99), "direct_p99_ms")
				b.ReportMetric(pct(proxied, 0.50), "proxy_p50_ms")
				b.ReportMetric(pct(proxied, 0.99), "proxy_p99_ms")
				b.ReportMetric(pct(proxied, 0.50)-pct(direct, 0.50), "added_p50_ms")
				b.ReportMetric(pct(proxied, 0.99)-pct(direct, 0.99), "added_p99_ms")
			})
		}
	}
	as, err := store.AdmissionRecent(ctx, "acme", 1)
	if err != nil || len(as) == 0 || as[0].State != account.StateSettled {
		b.Fatalf("the last admission: %+v %v", as, err)
	}
}
