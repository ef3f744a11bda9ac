package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/api"
	"github.com/tokengate/tokengate/api/proxy"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/pgtest"
)

type edgeBundle struct {
	store    *account.Store
	key      string
	base     string
	upstream atomic.Int32
}

// setupEdge runs the proxy on a server with the replica's HTTP timeouts (a
// short body read deadline) in front of an upstream that counts its calls.
func setupEdge(t *testing.T, bodyLimit int64) *edgeBundle {
	t.Helper()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	_, key, err := credential.KeyCreate(ctx, pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	b := &edgeBundle{store: store, key: key}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.upstream.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`)
	}))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	rep, err := replica.New(replica.Config{DB: pool, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rep.Close)
	p := proxy.New(rep, proxy.Config{Upstream: upURL, BodyLimit: bodyLimit})
	srv := httptest.NewUnstartedServer(p)
	api.HTTPTimeouts{BodyRead: 300 * time.Millisecond, Drain: 100 * time.Millisecond}.Apply(srv.Config)
	srv.Start()
	t.Cleanup(srv.Close)
	b.base = srv.URL
	return b
}

func (b *edgeBundle) post(t *testing.T, body io.Reader, headers ...string) (int, string) {
	t.Helper()
	status, _, raw := postChat(t, b.base, b.key, body, headers...)
	return status, raw
}

// TestProxyBadInputIsA4xx: a NUL in the model and a bad Idempotency-Key are
// 400s naming the parameter, a chunked body over the limit is 413 as a
// declared one is; none reaches the upstream or moves the balance.
func TestProxyBadInputIsA4xx(t *testing.T) {
	t.Parallel()
	b := setupEdge(t, 4096)
	good := `{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	big := `{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 2000) + `"}]}`
	for _, tc := range []struct {
		name    string
		body    io.Reader
		headers []string
		status  int
		want    string
	}{
		{"NUL in the model", strings.NewReader(`{"model":"gpt-4o\u0000","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`), nil, http.StatusBadRequest, `"param":"model"`},
		{"idempotency key too long", strings.NewReader(good), []string{"Idempotency-Key", strings.Repeat("k", 256)}, http.StatusBadRequest, `"param":"Idempotency-Key"`},
		{"idempotency key with a control character", strings.NewReader(good), []string{"Idempotency-Key", "call\t1"}, http.StatusBadRequest, `"param":"Idempotency-Key"`},
		{"idempotency key with a space", strings.NewReader(good), []string{"Idempotency-Key", "call 1"}, http.StatusBadRequest, `"param":"Idempotency-Key"`},
		{"body over the limit, declared", strings.NewReader(big), nil, http.StatusRequestEntityTooLarge, "larger"},
		{"body over the limit, chunked", io.MultiReader(strings.NewReader(big)), nil, http.StatusRequestEntityTooLarge, "larger"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, raw := b.post(t, tc.body, tc.headers...)
			if status != tc.status || !strings.Contains(raw, tc.want) {
				t.Fatalf("%d %s, want %d with %s", status, raw, tc.status, tc.want)
			}
		})
	}
	if n := b.upstream.Load(); n != 0 {
		t.Fatalf("the upstream was called %d times", n)
	}
	snap, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if snap.Tokens() != 100_000 {
		t.Fatalf("the balance moved to %d", snap.Tokens())
	}
	if status, raw := b.post(t, strings.NewReader(good), "Idempotency-Key", "stainless-python-retry-1"); status != http.StatusOK {
		t.Fatalf("a good call: %d %s", status, raw)
	}
}

// TestProxySlowBodyIs408AndClosed: a body slower than the body read
// deadline answers 408 and its connection is closed; nothing is reserved.
func TestProxySlowBodyIs408AndClosed(t *testing.T) {
	t.Parallel()
	b := setupEdge(t, 0)
	u, _ := url.Parse(b.base)
	for _, tc := range []struct {
		name, key string
		status    int
	}{
		{"authenticated", b.key, http.StatusRequestTimeout},
		{"unauthenticated", "tg_nosuchkey_000000", http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", u.Host)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			body := `{"model":"gpt-4o","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
			start := time.Now()
			if _, err := io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+tc.key+
				"\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body[:3]); err != nil {
				t.Fatal(err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || !resp.Close {
				t.Fatalf("%d (close %v) %s, want %d and the connection closed", resp.StatusCode, resp.Close, raw, tc.status)
			}
			if _, err := br.ReadByte(); err == nil {
				t.Fatal("the connection carried more after the answer")
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("the connection was held %s", d)
			}
		})
	}
	if n := b.upstream.Load(); n != 0 {
		t.Fatalf("the upstream was called %d times", n)
	}
}
