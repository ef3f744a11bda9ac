package proxy_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/tokengate/tokengate/api/proxy"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/memtest"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// gateBundle is a proxy on both wires, in front of an upstream that
// counts its calls, with the replica's estimate gate configured by the
// test and two tenants.
type gateBundle struct {
	base     string
	keys     map[string]string
	rep      *replica.Replica
	pool     *pgxpool.Pool // the harness's, for the test's own SQL
	upstream atomic.Int64
}

func setupGate(t *testing.T, cfg replica.Config) *gateBundle {
	t.Helper()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	b := &gateBundle{keys: map[string]string{}, pool: pool}
	for _, id := range []string{"acme", "globex"} {
		if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: rule.Limits{TokensCapacity: 1_000_000_000, TokensRateMicro: 1}}); err != nil {
			t.Fatal(err)
		}
		_, key, err := credential.KeyCreate(ctx, pool, id)
		if err != nil {
			t.Fatal(err)
		}
		b.keys[id] = key
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.upstream.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"input_tokens":3}`)
	}))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	cfg.DB, cfg.Store, cfg.Registry = pool, store, prometheus.NewRegistry()
	rep, err := replica.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rep.Close)
	b.rep = rep
	srv := httptest.NewServer(proxy.New(rep, proxy.Config{Upstream: upURL, UpstreamKey: "sk-upstream", AnthropicUpstream: upURL, AnthropicKey: "sk-ant-upstream"}))
	t.Cleanup(srv.Close)
	b.base = srv.URL
	return b
}

// post sends body on path with the tenant's key, as the wire's SDKs send
// it (a bearer token for OpenAI's routes, x-api-key for Anthropic's).
func (b *gateBundle) post(t *testing.T, tenant, path string, body []byte) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.base+path, bytes.NewReader(body))
	if strings.HasPrefix(path, "/v1/messages") {
		req.Header.Set("x-api-key", b.keys[tenant])
		req.Header.Set("anthropic-version", "2023-06-01")
	} else {
		req.Header.Set("Authorization", "Bearer "+b.keys[tenant])
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, nil, ""
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(raw)
}

// wireBodies are a small call of each route the proxy estimates.
var wireBodies = map[string]string{
	"/v1/chat/completions":      `{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"Hello there"}]}`,
	"/v1/embeddings":            `{"model":"text-embedding-3-small","input":"Hello there"}`,
	"/v1/messages":              `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"Hello there"}]}`,
	"/v1/messages/count_tokens": `{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"Hello there"}]}`,
}

// TestEstimateGateOnTheProxyWires: while a tenant holds its whole share of
// the replica's estimate gate, its calls on every route the proxy
// estimates (chat completions, embeddings, messages, count_tokens) wait
// the gate's wait and are answered 503 with Retry-After in the wire's own
// error shape (OpenAI's error object of type estimator_busy, Anthropic's
// overloaded_error), never reaching the upstream; another tenant's calls
// are served meanwhile.
func TestEstimateGateOnTheProxyWires(t *testing.T) {
	t.Parallel()
	const wait = 300 * time.Millisecond // real time is the subject: the wait
	b := setupGate(t, replica.Config{EstimateBytes: 4 << 20, EstimateTenantBytes: 1 << 20, EstimateWait: wait})
	for _, enc := range []string{estimator.EncodingO200K, estimator.EncodingCL100K} { // loaded once, in a few hundred ms
		if _, err := estimator.CountText(enc, "warm up"); err != nil {
			t.Fatal(err)
		}
	}
	release, err := b.rep.EstimateGate.Acquire(ctx, "acme", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	for path, body := range wireBodies {
		start := time.Now()
		code, h, raw := b.post(t, "acme", path, []byte(body))
		took := time.Since(start)
		if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
			t.Errorf("%s with acme's share taken: %d %s (Retry-After %q); want 503 with Retry-After", path, code, raw, h.Get("Retry-After"))
		}
		if took < wait {
			t.Errorf("%s answered after %s, before the gate's wait of %s", path, took, wait)
		}
		if strings.HasPrefix(path, "/v1/messages") {
			var e struct {
				Type  string `json:"type"`
				Error struct{ Type, Message string }
			}
			if json.Unmarshal([]byte(raw), &e) != nil || e.Type != "error" || e.Error.Type != "overloaded_error" || !strings.Contains(e.Error.Message, "estimator_busy") {
				t.Errorf("%s: %s; want Anthropic's error shape, overloaded_error naming estimator_busy", path, raw)
			}
		} else {
			var e struct {
				Error struct {
					Type, Message string
					Code          *string
				}
			}
			if json.Unmarshal([]byte(raw), &e) != nil || e.Error.Type != "estimator_busy" || e.Error.Code == nil || *e.Error.Code != "estimator_busy" || e.Error.Message == "" {
				t.Errorf("%s: %s; want OpenAI's error object of type and code estimator_busy", path, raw)
			}
		}
		// globex is served meanwhile (were it held back by acme's share,
		// it would be refused after the same wait).
		if code, _, raw := b.post(t, "globex", path, []byte(body)); code != http.StatusOK {
			t.Errorf("%s for globex while acme's share is taken: %d %s", path, code, raw)
		}
	}
	// globex's calls but count_tokens, which the estimate answers.
	if n := b.upstream.Load(); n != int64(len(wireBodies)-1) {
		t.Errorf("the upstream was called %d times; want %d (globex's calls only)", n, len(wireBodies)-1)
	}
}

// The bound of TestHostileBodiesThroughTheProxyWires, as the API's
// (api/estimate_memory_test.go, which says why): a gate of 4 MiB, a heap
// growth under 16 times it plus 64 MiB, the resident set's under
// memtest.RSSFactor times that.
const (
	gateBytes       = 4 << 20
	heapPerGateByte = 16
	heapMargin      = 64 << 20
)

// TestHostileBodiesThroughTheProxyWires (issue 36, P3): eight concurrent
// 3.9 MB calls of one long word, two on each route the proxy estimates,
// from one tenant key: each is answered 400 in its wire's shape, none
// reaches the upstream, nothing is written, and the process's heap and
// resident set grow by less than the bound. Not parallel: it measures the
// whole process.
func TestHostileBodiesThroughTheProxyWires(t *testing.T) {
	b := setupGate(t, replica.Config{EstimateBytes: gateBytes, EstimateWait: 10 * time.Minute})
	for path, body := range wireBodies { // warm up: the encodings load once
		if code, _, raw := b.post(t, "acme", path, []byte(body)); code != http.StatusOK {
			t.Fatalf("warm-up %s: %d %s", path, code, raw)
		}
	}
	calls := b.upstream.Load()
	admissions := func() (n int) {
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM admissions`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	admitted := admissions() // the warm-up's
	word := strings.Repeat("a", 3_900_000)
	hostile := map[string][]byte{
		"/v1/chat/completions":      []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"` + word + `"}]}`),
		"/v1/embeddings":            []byte(`{"model":"text-embedding-3-small","input":"` + word + `"}`),
		"/v1/messages":              []byte(`{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"` + word + `"}]}`),
		"/v1/messages/count_tokens": []byte(`{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"` + word + `"}]}`),
	}
	mp := memtest.Start(t)
	var wg sync.WaitGroup
	for path, body := range hostile {
		for range 2 {
			wg.Go(func() {
				code, _, raw := b.post(t, "acme", path, body)
				if code != http.StatusBadRequest || !strings.Contains(raw, "context window") {
					t.Errorf("%s: %d %.300s; want 400 over the context window", path, code, raw)
				}
			})
		}
	}
	wg.Wait()
	heap, rss := mp.End(t)
	bound := uint64(heapPerGateByte*gateBytes + heapMargin)
	t.Logf("eight 3.9 MB long words on the proxy wires: peak heap +%d MiB, peak RSS +%d MiB (bounds %d and %d MiB)", heap>>20, rss>>20, bound>>20, bound*memtest.RSSFactor>>20)
	if heap > bound || rss > bound*memtest.RSSFactor {
		t.Errorf("peak heap +%d MiB, RSS +%d MiB: over the bounds of %d and %d MiB", heap>>20, rss>>20, bound>>20, bound*memtest.RSSFactor>>20)
	}
	if n := b.upstream.Load() - calls; n != 0 {
		t.Errorf("the upstream was called %d times for calls over the window", n)
	}
	if n := admissions() - admitted; n != 0 {
		t.Errorf("%d admissions written", n)
	}
}
