package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/api"
	"github.com/tokengate/tokengate/api/client"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/await"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

// TestMain builds the tokenizer tables before any test times a request:
// building them costs a second, and several under -race on a busy machine,
// which a first request's client timeout would turn into retries.
func TestMain(m *testing.M) {
	if err := estimator.Load(); err != nil {
		panic(err)
	}
	pgtest.Main(m)
}

var ctx = context.Background()

type bundle struct {
	pool  *pgxpool.Pool
	store *account.Store
	url   string
	key   string
}

// setup serves a real tokengate (API on real Postgres) with one tenant.
func setup(t *testing.T, limits rule.Limits) *bundle {
	t.Helper()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	rep, err := replica.New(replica.Config{DB: pool, Store: store, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rep.Close)
	srv, err := api.New(rep, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: limits}); err != nil {
		t.Fatal(err)
	}
	_, key, err := credential.KeyCreate(ctx, pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{pool: pool, store: store, url: hs.URL, key: key}
}

// faulty is the network between the frontend and tokengate: it counts
// attempts and can lose answers after tokengate acted on them.
type faulty struct {
	attempts atomic.Int32
	lose     atomic.Int32 // answers still to lose
}

func (f *faulty) RoundTrip(r *http.Request) (*http.Response, error) {
	f.attempts.Add(1)
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil && f.lose.Add(-1) >= 0 {
		resp.Body.Close()
		return nil, errors.New("connection reset (the answer was lost)")
	}
	return resp, err
}

func (b *bundle) client(t *testing.T, net *faulty, cfg client.Config) *client.Client {
	t.Helper()
	cfg.BaseURL, cfg.Key = b.url, b.key
	if net != nil {
		cfg.HTTPClient = &http.Client{Transport: net}
	}
	c, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func chat(max int, text string) map[string]any {
	return map[string]any{"model": "gpt-4o", "max_tokens": max, "messages": []map[string]string{{"role": "user", "content": text}}}
}

func (b *bundle) admissions(t *testing.T) []*account.Admission {
	t.Helper()
	as, err := b.store.AdmissionRecent(ctx, "acme", 1000)
	if err != nil {
		t.Fatal(err)
	}
	return as
}

func (b *bundle) verify(t *testing.T) {
	t.Helper()
	if _, err := ledger.Verify(ctx, b.pool, "acme"); err != nil {
		t.Fatal(err)
	}
	for _, a := range b.admissions(t) {
		if a.State == account.StateReserved {
			t.Fatalf("admission %s left reserved", a.ID)
		}
	}
}

func (b *bundle) tokens(t *testing.T) int64 {
	t.Helper()
	snap, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	return snap.Tokens()
}

// TestSettleReasoningTokens: the client sends the reasoning part of the
// output; the server takes it within the output and refuses it beyond,
// naming the field and charging nothing.
func TestSettleReasoningTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 10_000, TokensRateMicro: 1})
	c := b.client(t, nil, client.Config{})
	a, err := c.Reserve(ctx, client.Request{Body: chat(100, "Think, then say hello.")})
	if err != nil {
		t.Fatal(err)
	}
	before := b.tokens(t)
	_, err = c.Settle(ctx, a, client.Usage{InputTokens: a.Estimate.InputTokens, OutputTokens: 12, ReasoningTokens: 13})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest || apiErr.Field != "usage.completion_tokens_details.reasoning_tokens" ||
		b.tokens(t) != before {
		t.Fatalf("13 reasoning of 12 output: %v, balance %d (was %d)", err, b.tokens(t), before)
	}
	e, err := c.Settle(ctx, a, client.Usage{InputTokens: a.Estimate.InputTokens, OutputTokens: 12, ReasoningTokens: 12})
	if err != nil || e.State != "settled" || b.tokens(t) != 10_000-a.Estimate.InputTokens-12 {
		t.Fatalf("settled: %+v %v, balance %d", e, err, b.tokens(t))
	}
}

// TestReserveSettleRelease: the three calls against a real server, the
// balance exact after each.
func TestReserveSettleRelease(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 10_000, TokensRateMicro: 1}) // no refill worth counting
	c := b.client(t, nil, client.Config{})
	a, err := c.Reserve(ctx, client.Request{Body: chat(100, "Say hello to the platform team.")})
	if err != nil {
		t.Fatal(err)
	}
	if a.ID == "" || a.Estimate.OutputTokens != 100 || a.Estimate.Cost != a.Estimate.InputTokens+100 || a.Remaining.Tokens != 10_000-a.Estimate.Cost {
		t.Fatalf("admission: %+v", a)
	}
	e, err := c.Settle(ctx, a, client.Usage{InputTokens: a.Estimate.InputTokens, OutputTokens: 12})
	if err != nil {
		t.Fatal(err)
	}
	if e.State != "settled" || e.Delta != 88 || b.tokens(t) != 10_000-a.Estimate.InputTokens-12 {
		t.Fatalf("settled: %+v, balance %d", e, b.tokens(t))
	}
	again, err := c.Settle(ctx, a, client.Usage{InputTokens: a.Estimate.InputTokens, OutputTokens: 12})
	if err != nil || again.State != "settled" || b.tokens(t) != 10_000-a.Estimate.InputTokens-12 {
		t.Fatalf("settling again: %+v %v", again, err)
	}
	_, err = c.Settle(ctx, a, client.Usage{InputTokens: 1, OutputTokens: 1})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusConflict {
		t.Fatalf("settling with other usage: %v", err)
	}
	r, err := c.Reserve(ctx, client.Request{Body: []byte(`{"model":"gpt-4o","max_tokens":50,"prompt":"x"}`)})
	if err != nil {
		t.Fatal(err)
	}
	before := b.tokens(t)
	if e, err := c.Release(ctx, r); err != nil || e.State != "released" || b.tokens(t) != before+r.Estimate.Cost {
		t.Fatalf("release: %+v %v", e, err)
	}
	_, err = c.Reserve(ctx, client.Request{Body: []byte(`{"model":"gpt-4o","messages":"hi"}`)})
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest || apiErr.Field != "messages" {
		t.Fatalf("bad input: %v", err)
	}
	b.verify(t)
}

// TestLostAnswersAreRetriedWithoutDoubleCharge: tokengate admits, the
// answer is lost, twice; the client's retries carry the same
// Idempotency-Key and get the first admission. One debit; settle's retry
// after a lost answer is applied once too.
func TestLostAnswersAreRetriedWithoutDoubleCharge(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 10_000, TokensRateMicro: 1})
	net := &faulty{}
	c := b.client(t, net, client.Config{})
	net.lose.Store(2)
	a, err := c.Reserve(ctx, client.Request{Body: chat(100, "hello")})
	if err != nil {
		t.Fatal(err)
	}
	if net.attempts.Load() != 3 || !a.Replayed {
		t.Fatalf("%d attempts, replayed %v: want 3, the last a replay", net.attempts.Load(), a.Replayed)
	}
	if as := b.admissions(t); len(as) != 1 || b.tokens(t) != 10_000-a.Estimate.Cost {
		t.Fatalf("%d admissions, balance %d: charged more than once", len(as), b.tokens(t))
	}
	net.lose.Store(1)
	if _, err := c.Settle(ctx, a, client.Usage{InputTokens: a.Estimate.InputTokens, OutputTokens: 10}); err != nil {
		t.Fatal(err)
	}
	if b.tokens(t) != 10_000-a.Estimate.InputTokens-10 {
		t.Fatalf("balance %d after the settle's retry", b.tokens(t))
	}
	b.verify(t)
}

// TestRetryAfterIsHonouredWithinTheDeadline: a refusal is retried no
// earlier than tokengate's Retry-After and then admitted; with a deadline
// shorter than the Retry-After, the refusal comes back at once; a wrong
// key is not retried at all.
func TestRetryAfterIsHonouredWithinTheDeadline(t *testing.T) {
	t.Parallel()
	// 20 tokens/s: the second request is about 66 tokens short, a Retry-After
	// of about 3.3 s (within the client's 5 s MaxBackoff). At 200/s it was
	// 330 ms, and a stall of half that on the real clock refilled enough to
	// admit at once what the test expects refused.
	b := setup(t, rule.Limits{TokensCapacity: 150, TokensRateMicro: 20 * rule.Micro})
	net := &faulty{}
	c := b.client(t, net, client.Config{})
	first, err := c.Reserve(ctx, client.Request{Body: chat(100, "hello")}) // about 108 of 150
	if err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = c.Reserve(dctx, client.Request{Body: chat(100, "hello")})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || !apiErr.Rejected() || apiErr.Limit != "tokens" || apiErr.RetryAfter < 50*time.Millisecond {
		t.Fatalf("under a short deadline: %v", err)
	}
	// Answered at once: it did not sleep into the deadline.
	if errors.Is(err, context.DeadlineExceeded) || net.attempts.Load() != 2 {
		t.Fatalf("%v after %d attempts: it waited for a Retry-After of %v past the deadline", err, net.attempts.Load(), apiErr.RetryAfter)
	}
	net.attempts.Store(0)
	start := time.Now()
	second, err := c.Reserve(ctx, client.Request{Body: chat(100, "hello")})
	if err != nil {
		t.Fatal(err)
	}
	// The refusal said how long; the retry came no earlier.
	if net.attempts.Load() < 2 || time.Since(start) < apiErr.RetryAfter/2 {
		t.Fatalf("%d attempts in %v", net.attempts.Load(), time.Since(start))
	}
	if as := b.admissions(t); len(as) != 2 {
		t.Fatalf("%d admissions, want 2: refusals are not admissions", len(as))
	}
	for _, a := range []*client.Admission{first, second} {
		if _, err := c.Release(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	net.attempts.Store(0)
	wrong, _ := client.New(client.Config{BaseURL: b.url, Key: "tg_nosuchkey_000000", HTTPClient: &http.Client{Transport: net}})
	if _, err := wrong.Reserve(ctx, client.Request{Body: chat(1, "x")}); !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnauthorized || net.attempts.Load() != 1 {
		t.Fatalf("wrong key: %v after %d attempts, want one 401", err, net.attempts.Load())
	}
	b.verify(t)
}

// TestUnreachableIsBoundedRetries: nothing listening; the client tries
// 1 + MaxRetries times, with backoff, and gives up.
func TestUnreachableIsBoundedRetries(t *testing.T) {
	t.Parallel()
	hs := httptest.NewServer(http.NotFoundHandler())
	addr := hs.URL
	hs.Close()
	net := &faulty{}
	c, err := client.New(client.Config{BaseURL: addr, Key: "tg_x_y", MaxRetries: 2, HTTPClient: &http.Client{Transport: net}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx, client.Request{Body: chat(1, "x")}); err == nil || net.attempts.Load() != 3 {
		t.Fatalf("%v after %d attempts, want an error after 3", err, net.attempts.Load())
	}
}

// TestMiddleware: the handler runs only for an admitted request, sees its
// body and admission, and its admission ends as it reported: settled with
// its usage, released after an error or a panic, settled at the estimate
// when it reported nothing; bad input is tokengate's 400, and the handler
// never sees it.
func TestMiddleware(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	c := b.client(t, nil, client.Config{MaxRetries: -1})
	var ran atomic.Int32
	h := c.Middleware(client.MiddlewareConfig{Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		body, _ := io.ReadAll(r.Body)
		if _, ok := client.AdmissionFrom(r.Context()); !ok || !strings.Contains(string(body), `"model"`) {
			t.Errorf("the handler saw no admission or no body: %s", body)
		}
		switch r.URL.Path {
		case "/usage":
			client.ReportUsage(r.Context(), client.Usage{InputTokens: 40, OutputTokens: 25})
			w.Write([]byte("ok"))
		case "/fail":
			http.Error(w, "the model failed", http.StatusBadGateway)
		case "/panic":
			panic(http.ErrAbortHandler)
		default:
			w.Write([]byte("ok"))
		}
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	post := func(path, body string) *http.Response {
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			if path == "/panic" {
				return nil
			}
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	req := `{"model":"gpt-4o","max_tokens":100,"messages":[{"role":"user","content":"hello"}]}`
	for _, path := range []string{"/usage", "/fail", "/panic", "/silent"} {
		post(path, req)
	}
	bad := post("/usage", `{"model":"gpt-4o","messages":"hi"}`)
	if bad.StatusCode != http.StatusBadRequest || ran.Load() != 4 {
		t.Fatalf("bad input: %d, handler ran %d times", bad.StatusCode, ran.Load())
	}
	as := b.admissions(t) // newest first
	if len(as) != 4 {
		t.Fatalf("%d admissions", len(as))
	}
	silent, panicked, failed, used := as[0], as[1], as[2], as[3]
	if used.State != account.StateSettled || *used.ActualInput != 40 || *used.ActualOutput != 25 ||
		failed.State != account.StateReleased || panicked.State != account.StateReleased ||
		silent.State != account.StateSettled || *silent.ActualCost != silent.Estimate.Cost {
		t.Fatalf("admissions ended as %s %s %s %s", used.State, failed.State, panicked.State, silent.State)
	}
	b.verify(t)
}

// TestMiddlewareUnderConcurrency: 64 requests at once through the
// middleware, from 64 connections, against an allowance for exactly 20 of
// them: exactly 20 reach the handler, the rest get 429 with Retry-After,
// and the 20 admissions end settled with what the handler reported. The
// handlers hold their admissions until every request has its answer (a
// settle's refund would make room for more).
func TestMiddlewareUnderConcurrency(t *testing.T) {
	t.Parallel()
	req := `{"model":"gpt-4o","max_tokens":100,"messages":[{"role":"user","content":"hello"}]}`
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	c := b.client(t, nil, client.Config{MaxRetries: -1})
	probe, err := c.Reserve(ctx, client.Request{Body: []byte(req)}) // the estimate, to size the allowance
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, probe); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: "beta", Limits: rule.Limits{TokensCapacity: 20 * probe.Estimate.Cost, TokensRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	_, betaKey, err := credential.KeyCreate(ctx, b.pool, "beta")
	if err != nil {
		t.Fatal(err)
	}
	var ran, refused atomic.Int32
	hold := make(chan struct{})
	h := c.Middleware(client.MiddlewareConfig{Key: func(*http.Request) string { return betaKey }})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		<-hold
		client.ReportUsage(r.Context(), client.Usage{InputTokens: 5, OutputTokens: 5})
		w.Write([]byte("ok"))
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	const n = 64
	codes := make(chan int, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			hc := &http.Client{Transport: &http.Transport{}} // a connection of its own
			resp, err := hc.Post(srv.URL, "application/json", strings.NewReader(req))
			if err != nil {
				t.Error(err)
				return
			}
			if resp.StatusCode == http.StatusTooManyRequests {
				refused.Add(1)
				if resp.Header.Get("Retry-After") == "" {
					t.Error("a 429 without Retry-After")
				}
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	close(start)
	await.Until(t, 30*time.Second, "every call to be in the handler or refused", func() bool { return ran.Load()+refused.Load() >= n },
		func() string {
			return fmt.Sprintf("%d in the handler, %d refused, of %d", ran.Load(), refused.Load(), n)
		})
	close(hold)
	wg.Wait()
	close(codes)
	tally := map[int]int{}
	for code := range codes {
		tally[code]++
	}
	if tally[http.StatusOK] != 20 || tally[http.StatusTooManyRequests] != n-20 || ran.Load() != 20 {
		t.Fatalf("answers %v, handler ran %d times: want exactly 20 admitted", tally, ran.Load())
	}
	as, err := b.store.AdmissionRecent(ctx, "beta", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != 20 {
		t.Fatalf("%d admissions", len(as))
	}
	for _, a := range as {
		if a.State != account.StateSettled || *a.ActualCost != 10 {
			t.Fatalf("admission %s: %s", a.ID, a.State)
		}
	}
	if _, err := ledger.Verify(ctx, b.pool, "beta"); err != nil {
		t.Fatal(err)
	}
}

// TestBudgetExhaustedIsNotRetried: a window out of room is told apart
// from a rate limit, and the client does not spend its retries on it.
func TestBudgetExhaustedIsNotRetried(t *testing.T) {
	t.Parallel()
	n := int64(150)
	ws, err := rule.ParseWindows([]rule.WindowJSON{{Name: "hourly", Unit: "hour", Tokens: &n}})
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, rule.Limits{TokensCapacity: 1_000_000, TokensRateMicro: 1000 * rule.Micro, Windows: ws})
	net := &faulty{}
	c := b.client(t, net, client.Config{MaxRetries: 5})
	if _, err := c.Reserve(ctx, client.Request{Body: chat(100, "hello")}); err != nil { // about 108 of 150
		t.Fatal(err)
	}
	net.attempts.Store(0)
	_, err = c.Reserve(ctx, client.Request{Body: chat(100, "hello")})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || !apiErr.BudgetExhausted() || !apiErr.Rejected() || apiErr.Limit != "period_budget" || apiErr.RetryAfter <= 0 {
		t.Fatalf("over the window: %v", err)
	}
	if net.attempts.Load() != 1 {
		t.Fatalf("%d attempts, want 1: an exhausted budget is not retried", net.attempts.Load())
	}
}
