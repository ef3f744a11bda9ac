package api_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/api"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// logBuffer collects a server's JSON log lines, safely across goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) errorLines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.buf.String(), "\n") {
		if strings.Contains(line, `"level":"ERROR"`) {
			out = append(out, line)
		}
	}
	return out
}

// TestNULIsA400NamingTheField: a NUL byte, as JSON's \u0000 or as %00 in a
// path or query, never reaches Postgres (which refuses it, SQLSTATE 22021):
// every text input answers 400 naming its field, nothing moves, and the
// server logs no ERROR line.
func TestNULIsA400NamingTheField(t *testing.T) {
	t.Parallel()
	logs := &logBuffer{}
	b := setupAPI(t, func(c *testConfig) { c.Logger = slog.New(slog.NewJSONHandler(logs, nil)) })
	key := b.tenant(t, "acme", rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	admin := b.admin(t, "ops")

	rec := b.call(t, key, http.MethodPost, "/v1/admissions", chat(10, "hello"))
	if rec.Code != http.StatusCreated {
		t.Fatalf("a good admission: %d %s", rec.Code, rec.Body)
	}
	var adm admitted
	rec.json(&adm)
	before, seq := b.balance(t, "acme")

	for _, tc := range []struct {
		name, token, method, path, body, field string
	}{
		{"admission model", key, http.MethodPost, "/v1/admissions", `{"model":"gpt-4o\u0000","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`, "model"},
		{"estimate model", key, http.MethodPost, "/v1/estimate", `{"model":"\u0000","prompt":"hi"}`, "model"},
		{"admission id", key, http.MethodGet, "/v1/admissions/adm_%00", "", "id"},
		{"settled admission id", key, http.MethodPost, "/v1/admissions/" + adm.ID + "%00/settle", `{"usage":{"prompt_tokens":1,"completion_tokens":1}}`, "id"},
		{"released admission id", key, http.MethodPost, "/v1/admissions/%00/release", "", "id"},
		{"tenant ledger filter", key, http.MethodGet, "/v1/ledger?model=gpt%00", "", "model"},
		{"tenant ledger admission filter", key, http.MethodGet, "/v1/ledger?admission_id=%00", "", "admission_id"},
		{"admin ledger filter", admin, http.MethodGet, "/v1/admin/ledger?tenant=ac%00me", "", "tenant"},
		{"admin ledger actor", admin, http.MethodGet, "/v1/admin/ledger?actor=%00", "", "actor"},
		{"admin audit tenant", admin, http.MethodGet, "/v1/admin/ledger/verify?tenant=%00", "", "tenant"},
		{"admin tenant id in path", admin, http.MethodGet, "/v1/admin/tenants/ac%00me", "", "id"},
		{"admin adjustment reason", admin, http.MethodPost, "/v1/admin/tenants/acme/adjustments", `{"tokens":5,"reason":"credit\u0000"}`, "reason"},
		{"admin disable reason", admin, http.MethodPost, "/v1/admin/tenants/acme/disable", `{"reason":"\u0000"}`, "reason"},
		{"admin tenant create id", admin, http.MethodPost, "/v1/admin/tenants", `{"id":"be\u0000ta","tokens_capacity":10,"tokens_per_second":1}`, "id"},
		{"admin model name", admin, http.MethodPost, "/v1/admin/models", `{"name":"my\u0000model"}`, "name"},
		{"admin model name in path", admin, http.MethodPatch, "/v1/admin/models/gpt%00", `{"input_weight":2}`, "name"},
		{"admin alert description", admin, http.MethodPost, "/v1/admin/alerts/endpoints", `{"url":"https://example.com/hook","description":"ops\u0000"}`, "description"},
		{"admin pool route model", admin, http.MethodPut, "/v1/admin/pools/p1/models", `{"model":"gpt\u0000"}`, "model"},
		{"admin field name", admin, http.MethodPost, "/v1/admin/tenants/acme/adjustments", `{"tokens":5,"reason":"x","\u0000":1}`, "body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := b.call(t, tc.token, tc.method, tc.path, tc.body)
			if rec.Code != http.StatusBadRequest {
				t.Fatalf("%s %s: %d %s, want 400", tc.method, tc.path, rec.Code, rec.Body)
			}
			if e := rec.errorBody(); e.Error.Field != tc.field || !strings.Contains(e.Error.Message, "NUL") {
				t.Fatalf("%s %s: %s, want field %q and a reason naming the NUL", tc.method, tc.path, rec.Body, tc.field)
			}
		})
	}
	if after, afterSeq := b.balance(t, "acme"); after != before || afterSeq != seq {
		t.Fatalf("the balance moved from %d (seq %d) to %d (seq %d)", before, seq, after, afterSeq)
	}
	if lines := logs.errorLines(); len(lines) > 0 {
		t.Fatalf("bad input was logged as a server error:\n%s", strings.Join(lines, "\n"))
	}

	// Message content is only counted, never stored: a NUL there is text
	// like any other, as it is for the provider.
	rec = b.call(t, key, http.MethodPost, "/v1/estimate", `{"model":"gpt-4o","messages":[{"role":"user","content":"a\u0000b"}]}`)
	if rec.Code != http.StatusOK {
		t.Fatalf("NUL in message content: %d %s, want 200", rec.Code, rec.Body)
	}
}

// TestStoreRefusedValueIsTheCallersError: a value Postgres refuses is
// recognized as the caller's (account.IsInvalidInput), for the faces to
// answer 400 / INVALID_ARGUMENT, and is not an outage.
func TestStoreRefusedValueIsTheCallersError(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	b.tenant(t, "acme", rule.Limits{TokensCapacity: 100, TokensRateMicro: 1})
	before, seq := b.balance(t, "acme")
	_, err := b.store.Adjust(ctx, account.AdjustParams{TenantID: "acme", Tokens: 5, Reason: "credit\x00", Actor: "admin:ops"})
	if err == nil {
		t.Fatal("a reason with a NUL was stored")
	}
	if after, afterSeq := b.balance(t, "acme"); after != before || afterSeq != seq {
		t.Fatal("the refused adjustment moved the balance")
	}
	if !account.IsInvalidInput(err) || errors.Is(err, rule.ErrUnavailable) {
		t.Fatalf("err = %v: want an invalid input, not an outage", err)
	}
	if account.IsInvalidInput(errors.New("other")) || account.IsInvalidInput(rule.ErrUnavailable) {
		t.Fatal("IsInvalidInput matched an error that is not Postgres refusing a value")
	}

	// Through the admission layer (the pipeline, the failure policy), past
	// the edge's checks: the refused value is the request's error, and the
	// replica does not take the store for down.
	_, _, err = b.rep.Admitter.Reserve(ctx, admission.Request{ReserveParams: account.ReserveParams{TenantID: "acme", Actor: "test",
		Estimate: estimator.Estimate{Model: "gpt-4o\x00", Family: "gpt-4o", InputTokens: 1, Cost: 1,
			InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}})
	if !account.IsInvalidInput(err) || errors.Is(err, rule.ErrUnavailable) {
		t.Fatalf("reserve with a NUL model: %v, want an invalid input", err)
	}
	if b.rep.Admitter.Down() {
		t.Fatal("a value the store refused marked the store down")
	}
	if after, afterSeq := b.balance(t, "acme"); after != before || afterSeq != seq {
		t.Fatal("the refused reservation moved the balance")
	}
}

// chunked is a body of n bytes of JSON-ish text, sent without a length.
type chunked struct{ r io.Reader }

func (c chunked) Read(p []byte) (int, error) { return c.r.Read(p) }

// TestChunkedBodyOverTheLimitIs413: a body larger than the body limit is
// 413 whether it declares its length or comes chunked.
func TestChunkedBodyOverTheLimitIs413(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, func(c *testConfig) { c.BodyLimit = 4096 })
	key := b.tenant(t, "acme", rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	admin := b.admin(t, "ops")
	big := chat(10, strings.Repeat("word ", 2000))
	for _, tc := range []struct{ token, path, body string }{
		{key, "/v1/admissions", big},
		{key, "/v1/estimate", big},
		{admin, "/v1/admin/tenants/acme/adjustments", `{"tokens":5,"reason":"` + strings.Repeat("x", 5000) + `"}`},
	} {
		for _, length := range []bool{true, false} {
			req := httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader(tc.body))
			if !length {
				req = httptest.NewRequest(http.MethodPost, tc.path, chunked{strings.NewReader(tc.body)})
				req.ContentLength = -1
			}
			req.Header.Set("Authorization", "Bearer "+tc.token)
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			b.srv.ServeHTTP(rec, req)
			if rec.Code != http.StatusRequestEntityTooLarge || decodeError(t, rec).Error.Type != "body_too_large" {
				t.Fatalf("%s (Content-Length sent: %v): %d %s, want 413 body_too_large", tc.path, length, rec.Code, rec.Body)
			}
		}
	}
}

// TestSlowBodyIs408AndClosed: a body that has not arrived within the body
// read timeout answers 408, and the connection is closed.
func TestSlowBodyIs408AndClosed(t *testing.T) {
	t.Parallel()
	logs := &logBuffer{}
	b := setupAPI(t, func(c *testConfig) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
		c.Timeouts = api.HTTPTimeouts{BodyRead: 300 * time.Millisecond, Drain: 100 * time.Millisecond}
	})
	key := b.tenant(t, "acme", rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.srv.Serve(sctx, ln) }()
	t.Cleanup(func() { stop(); <-done })

	for _, tc := range []struct {
		name, auth string
		status     int
	}{
		{"authenticated", "Bearer " + key, http.StatusRequestTimeout},
		// Refused before its body is read: the rest of the body is not
		// waited for past the drain timeout.
		{"unauthenticated", "Bearer tg_nosuchkey_000000", http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			body := chat(10, "hello")
			start := time.Now()
			_, err = io.WriteString(conn, "POST /v1/admissions HTTP/1.1\r\nHost: x\r\nAuthorization: "+tc.auth+
				"\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body[:5])
			if err != nil {
				t.Fatal(err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("%d %s, want %d", resp.StatusCode, raw, tc.status)
			}
			if !resp.Close {
				t.Fatalf("the answer keeps the connection open: %v", resp.Header)
			}
			if _, err := br.ReadByte(); err == nil {
				t.Fatal("the connection carried more after the answer")
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("the connection was held %s", d)
			}
		})
	}
	if lines := logs.errorLines(); len(lines) > 0 {
		t.Fatalf("a slow client was logged as a server error:\n%s", strings.Join(lines, "\n"))
	}
}
