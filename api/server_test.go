package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v5"

	"github.com/tokengate/tokengate/api"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/integration/await"
	"github.com/tokengate/tokengate/integration/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type testBundle struct {
	srv *api.Server
}

func setup(t *testing.T, pool *pgxpool.Pool) *testBundle {
	t.Helper()
	if pool == nil {
		pool = pgtest.New(t, nil)
	}
	srv, _ := newServer(t, &testConfig{replicaConfig: replica.Config{DB: pool},
		httpConfig: api.Config{BodyLimit: 1024, ShutdownTimeout: 5 * time.Second, ReadyTimeout: time.Second}})
	return &testBundle{srv: srv}
}

func (b *testBundle) do(t *testing.T, method, path, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, req)
	return rec
}

type errorBody struct {
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
		Field   string `json:"field"`
		Limit   string `json:"limit"`
		Window  string `json:"window"`
		// RetryAfterMS is set on a refusal.
		RetryAfterMS *int64 `json:"retry_after_ms"`
	} `json:"error"`
}

func decodeError(t testing.TB, rec *httptest.ResponseRecorder) errorBody {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
		t.Fatalf("body %q is not a JSON error: %v", rec.Body.String(), err)
	}
	if e.Error.Type == "" || e.Error.Message == "" {
		t.Fatalf("error body %q lacks type or message", rec.Body.String())
	}
	return e
}

func TestHealthzAndReadyz(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)

	if rec := b.do(t, http.MethodGet, "/healthz", ""); rec.Code != http.StatusOK {
		t.Fatalf("/healthz = %d %s", rec.Code, rec.Body)
	}
	rec := b.do(t, http.MethodGet, "/readyz", "")
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "ready") {
		t.Fatalf("/readyz = %d %s, want 200", rec.Code, rec.Body)
	}
	if rec.Header().Get(echo.HeaderXRequestID) == "" {
		t.Fatal("response lacks X-Request-Id")
	}
}

func TestReadyzUnavailableWhenDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	// A port nothing listens on: the pool is lazy, so New succeeds and
	// every check fails, as when the database goes away under a replica.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody:x@"+addr+"/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := setup(t, pool)

	rec := b.do(t, http.MethodGet, "/readyz", "")
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz = %d %s, want 503", rec.Code, rec.Body)
	}
	if e := decodeError(t, rec); e.Error.Type != "not_ready" || strings.Contains(rec.Body.String(), addr) {
		t.Fatalf("unexpected body %s", rec.Body)
	}
	if rec := b.do(t, http.MethodGet, "/healthz", ""); rec.Code != http.StatusOK {
		t.Fatalf("/healthz must not depend on the database, got %d", rec.Code)
	}
}

func TestReadyzUnavailableWhileMigrationsPending(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Pool(t, pgtest.EmptyURL(t), nil))

	rec := b.do(t, http.MethodGet, "/readyz", "")
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz = %d %s, want 503", rec.Code, rec.Body)
	}
	if e := decodeError(t, rec); !strings.Contains(e.Error.Message, "tokengate migrate") {
		t.Fatalf("message %q should name the command to run", e.Error.Message)
	}
}

func TestErrorsAreJSON(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.srv.Echo().POST("/test/panic", func(c *echo.Context) error { panic("boom: secret detail") })
	b.srv.Echo().POST("/test/echo", func(c *echo.Context) error {
		body, err := io.ReadAll(c.Request().Body)
		if err != nil {
			return err
		}
		return c.String(http.StatusOK, string(body))
	})

	tests := []struct {
		name, method, path, body string
		status                   int
		typ                      string
	}{
		{"unknown route", http.MethodGet, "/nope", "", http.StatusNotFound, "not_found"},
		{"panic", http.MethodPost, "/test/panic", "{}", http.StatusInternalServerError, "internal_error"},
		{"oversized body", http.MethodPost, "/test/echo", strings.Repeat("x", 4096), http.StatusRequestEntityTooLarge, "body_too_large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := b.do(t, tt.method, tt.path, tt.body)
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d (%s)", rec.Code, tt.status, rec.Body)
			}
			if e := decodeError(t, rec); e.Error.Type != tt.typ {
				t.Fatalf("type %q, want %q", e.Error.Type, tt.typ)
			}
			if strings.Contains(rec.Body.String(), "secret detail") || strings.Contains(rec.Body.String(), "goroutine") {
				t.Fatalf("body leaks internals: %s", rec.Body)
			}
		})
	}
	// The server survived the panic.
	if rec := b.do(t, http.MethodPost, "/test/echo", "hi"); rec.Code != http.StatusOK || rec.Body.String() != "hi" {
		t.Fatalf("after panic: %d %q", rec.Code, rec.Body)
	}
}

func TestMetricsExposed(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.do(t, http.MethodGet, "/healthz", "")
	rec := b.do(t, http.MethodGet, "/metrics", "")
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics = %d", rec.Code)
	}
	want := `tokengate_http_requests_total{code="200",method="GET",route="/healthz"} 1`
	if !strings.Contains(rec.Body.String(), want) {
		t.Fatalf("/metrics lacks %q", want)
	}
}

func TestGracefulShutdownFinishesInFlightRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	entered := make(chan struct{})
	release := make(chan struct{})
	b.srv.Echo().GET("/test/slow", func(c *echo.Context) error {
		close(entered)
		<-release
		return c.String(http.StatusOK, "finished")
	})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- b.srv.Serve(ctx, ln) }()

	type result struct {
		status int
		body   string
		err    error
	}
	got := make(chan result, 1)
	url := "http://" + ln.Addr().String()
	go func() {
		resp, err := http.Get(url + "/test/slow")
		if err != nil {
			got <- result{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		got <- result{status: resp.StatusCode, body: string(body), err: err}
	}()

	waitFor(t, entered, "the slow request to reach its handler")
	cancel() // as SIGTERM does in `tokengate serve`

	// The listener closes promptly: new connections are refused while the
	// in-flight request is still running.
	await.Until(t, 5*time.Second, "the listener to refuse connections once shutdown began", func() bool {
		conn, err := net.DialTimeout("tcp", ln.Addr().String(), 200*time.Millisecond)
		if err != nil {
			return true
		}
		_ = conn.Close()
		return false
	}, nil)
	select {
	case err := <-served:
		t.Fatalf("Serve returned (%v) before the in-flight request finished", err)
	default:
	}

	close(release)
	r := waitFor(t, got, "the in-flight response")
	if r.err != nil || r.status != http.StatusOK || r.body != "finished" {
		t.Fatalf("in-flight request: status %d body %q err %v", r.status, r.body, r.err)
	}
	if err := waitFor(t, served, "Serve to return"); err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

func waitFor[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func TestShutdownEndsWaitingCallers(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	key := b.tenant(t, "acme", lim(100, "0.35"))
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(90, "x")); r.Code != http.StatusCreated {
		t.Fatal(r.Body)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	// The admission layer is the replica's, which cmd owns: it stops the
	// waiters when serving ends, as `tokengate serve` does (no face stops
	// the layer every face shares).
	stopWaiters := context.AfterFunc(sctx, b.rep.Admitter.Stop)
	defer stopWaiters()
	served := make(chan error, 1)
	go func() { served <- b.srv.Serve(sctx, ln) }()

	// This caller needs 7 more tokens, 20 s of refill, and may wait 30 s.
	got := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/v1/admissions",
			strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"x"}],"max_tokens":1,"max_wait_ms":30000}`))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			got <- 0
			return
		}
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	// The caller must be waiting (the gauge says so) before shutdown
	// begins; answered instead, it fails the test.
	await.Until(t, 10*time.Second, "the caller to reach the wait", func() bool {
		select {
		case code := <-got:
			t.Fatalf("the caller was answered (%d) instead of waiting", code)
		default:
		}
		return strings.Contains(b.call(t, "", http.MethodGet, "/metrics", "").Body.String(), "\ntokengate_waiting_callers 1\n")
	}, nil)
	start := time.Now()
	cancel()
	if code := waitFor(t, got, "the waiting caller's answer"); code != http.StatusTooManyRequests {
		t.Fatalf("waiting caller got %d, want its 429 at shutdown", code)
	}
	if err := waitFor(t, served, "Serve to return"); err != nil || time.Since(start) > 3*time.Second {
		t.Fatalf("shutdown took %s (%v)", time.Since(start), err)
	}
}
