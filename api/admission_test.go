package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokengate/tokengate/api"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/await"
	"github.com/tokengate/tokengate/integration/pgtest"
)

var ctx = context.Background()

type apiBundle struct {
	pool  *pgxpool.Pool
	srv   *api.Server
	rep   *replica.Replica
	store *account.Store
}

// Both halves of a replica's configuration, for tests to change either:
// the domain's (replica.Config) and the HTTP server's (api.Config).
type (
	replicaConfig = replica.Config
	httpConfig    = api.Config
)

type testConfig struct {
	replicaConfig
	httpConfig
}

// newServer builds a replica and its HTTP server, as cmd does, closed when
// the test ends.
func newServer(t testing.TB, c *testConfig) (*api.Server, *replica.Replica) {
	t.Helper()
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	rep, err := replica.New(c.replicaConfig)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(rep, &c.httpConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close(); rep.Close() })
	return srv, rep
}

func setupAPI(t testing.TB, configure func(*testConfig)) *apiBundle {
	t.Helper()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	cfg := &testConfig{replicaConfig: replica.Config{DB: pool, Store: store}}
	if configure != nil {
		configure(cfg)
	}
	srv, rep := newServer(t, cfg)
	return &apiBundle{pool: pool, srv: srv, rep: rep, store: rep.Store}
}

// tenant creates a tenant and returns a key for it.
func (b *apiBundle) tenant(t testing.TB, id string, l rule.Limits) string {
	t.Helper()
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: l}); err != nil {
		t.Fatal(err)
	}
	_, secret, err := credential.KeyCreate(ctx, b.pool, id)
	if err != nil {
		t.Fatal(err)
	}
	return secret
}

type response struct {
	*httptest.ResponseRecorder
	t testing.TB
}

func (r response) json(v any) {
	r.t.Helper()
	if err := json.Unmarshal(r.Body.Bytes(), v); err != nil {
		r.t.Fatalf("body %q: %v", r.Body.String(), err)
	}
}

func (r response) errorBody() errorBody {
	r.t.Helper()
	return decodeError(r.t, r.ResponseRecorder)
}

func (b *apiBundle) call(t testing.TB, key, method, path, body string, headers ...string) response {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.RemoteAddr = "192.0.2.10:5555"
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, req)
	return response{rec, t}
}

// balance returns the stored token balance and ledger length of a tenant.
func (b *apiBundle) balance(t *testing.T, id string) (int64, int64) {
	t.Helper()
	var micro, seq int64
	if err := b.pool.QueryRow(ctx, `SELECT tokens_micro, ledger_seq FROM tenants WHERE id = $1`, id).Scan(&micro, &seq); err != nil {
		t.Fatal(err)
	}
	return micro, seq
}

func chat(maxTokens int, text string) string {
	return fmt.Sprintf(`{"model":"gpt-4o","messages":[{"role":"user","content":%q}],"max_tokens":%d}`, text, maxTokens)
}

type admitted struct {
	ID       string `json:"id"`
	Admitted bool   `json:"admitted"`
	Model    string `json:"model"`
	Estimate struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
		Cost         int64 `json:"cost"`
		Approximate  bool  `json:"approximate"`
	} `json:"estimate"`
	ExpiresAt time.Time `json:"expires_at"`
	Remaining struct {
		Tokens       int64  `json:"tokens"`
		Requests     *int64 `json:"requests"`
		PeriodBudget *int64 `json:"period_budget"`
	} `json:"remaining"`
}

func lim(capacity int64, perSecond string) rule.Limits {
	rate, err := rule.ParseRate(perSecond)
	if err != nil {
		panic(err)
	}
	return rule.Limits{TokensCapacity: capacity, TokensRateMicro: rate}
}

func TestAdmitSettleReadBudgetRoundTrip(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	l := lim(10_000, "0.001")
	l.RequestsCapacity, l.RequestsRateMicro = 100, 1
	key := b.tenant(t, "acme", l)

	res := b.call(t, key, http.MethodPost, "/v1/admissions", chat(200, "Hello there, how are you today?"))
	if res.Code != http.StatusCreated {
		t.Fatalf("admission: %d %s", res.Code, res.Body)
	}
	var a admitted
	res.json(&a)
	// "Hello there, how are you today?" is 8 o200k tokens; +3 per message,
	// +1 for the role, +3 reply priming.
	if !a.Admitted || !strings.HasPrefix(a.ID, "adm_") || a.Model != "gpt-4o" || a.Estimate.InputTokens != 15 ||
		a.Estimate.OutputTokens != 200 || a.Estimate.Cost != 215 || a.Estimate.Approximate {
		t.Fatalf("admission body: %s", res.Body)
	}
	if a.Remaining.Tokens != 10_000-215 || a.Remaining.Requests == nil || *a.Remaining.Requests != 99 || a.Remaining.PeriodBudget != nil {
		t.Fatalf("remaining: %+v", a.Remaining)
	}
	if res.Header().Get("X-RateLimit-Limit-Tokens") != "10000" || res.Header().Get("X-RateLimit-Remaining-Tokens") != "9785" ||
		res.Header().Get("X-RateLimit-Reset-Tokens") == "" || res.Header().Get("X-RateLimit-Limit-Requests") != "100" ||
		res.Header().Get("X-RateLimit-Remaining-Requests") != "99" {
		t.Fatalf("headers: %v", res.Header())
	}

	res = b.call(t, key, http.MethodGet, "/v1/admissions/"+a.ID, "")
	var got struct {
		State string `json:"state"`
	}
	res.json(&got)
	if res.Code != http.StatusOK || got.State != "reserved" || res.Header().Get("X-RateLimit-Limit-Tokens") != "10000" {
		t.Fatalf("get: %d %s", res.Code, res.Body)
	}

	res = b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/settle", `{"usage":{"prompt_tokens":15,"completion_tokens":40,"total_tokens":55}}`)
	if res.Code != http.StatusOK {
		t.Fatalf("settle: %d %s", res.Code, res.Body)
	}
	var st struct {
		State  string `json:"state"`
		Actual struct {
			Cost int64 `json:"cost"`
		} `json:"actual"`
		Delta   int64       `json:"delta"`
		Applied json.Number `json:"applied_delta"`
		Balance json.Number `json:"balance"`
	}
	res.json(&st)
	if st.State != "settled" || st.Actual.Cost != 55 || st.Delta != 160 || st.Applied != "160" {
		t.Fatalf("settle body: %s", res.Body)
	}
	if bal, err := st.Balance.Float64(); err != nil || bal < 10_000-55 || bal > 10_000-54 {
		t.Fatalf("balance %s, want 9945 and a little refill", st.Balance)
	}
	// Same settle again: the same answer.
	again := b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/settle", `{"usage":{"input_tokens":15,"output_tokens":40}}`)
	if again.Code != http.StatusOK || again.Body.String() != res.Body.String() {
		t.Fatalf("repeated settle: %d %s\nfirst: %s", again.Code, again.Body, res.Body)
	}
	// Different usage: 409.
	if r := b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/settle", `{"usage":{"prompt_tokens":16,"completion_tokens":40}}`); r.Code != http.StatusConflict {
		t.Fatalf("different settle: %d %s", r.Code, r.Body)
	}
	res = b.call(t, key, http.MethodGet, "/v1/budget", "")
	var bud struct {
		Tenant   string `json:"tenant"`
		Balances struct {
			Tokens           json.Number `json:"tokens"`
			OpenReservations int64       `json:"open_reservations"`
		} `json:"balances"`
	}
	res.json(&bud)
	if res.Code != http.StatusOK || bud.Tenant != "acme" || bud.Balances.OpenReservations != 0 {
		t.Fatalf("budget: %d %s", res.Code, res.Body)
	}
	if micro, seq := b.balance(t, "acme"); seq != 3 || micro < 9945*rule.Micro {
		t.Fatalf("stored balance %d after %d entries", micro, seq)
	}
}

func TestRejectionIs429WithRetryAfter(t *testing.T) {
	t.Parallel()
	// A frozen clock: at 2 tokens/s, a 2.5 s stall between the two calls
	// on the real clock would refill past the 46 the headers may show.
	at := time.Now()
	b := setupAPI(t, func(c *testConfig) { c.Store = account.NewStore(c.DB).WithClock(func() time.Time { return at }) })
	key := b.tenant(t, "acme", lim(300, "2"))
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(250, "hi")); r.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", r.Code, r.Body)
	}
	before, seq := b.balance(t, "acme")
	res := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hi"))
	if res.Code != http.StatusTooManyRequests {
		t.Fatalf("second: %d %s", res.Code, res.Body)
	}
	var body struct {
		Error struct {
			Type         string `json:"type"`
			Limit        string `json:"limit"`
			RetryAfterMS int64  `json:"retry_after_ms"`
		} `json:"error"`
		Estimate struct {
			Cost int64 `json:"cost"`
		} `json:"estimate"`
	}
	res.json(&body)
	// 300 - 258 = 42 left, plus what refilled since; the request costs 108:
	// just under 66 tokens short at 2/s. (The budget tests check the exact
	// figure against the decision's own clock.)
	if body.Error.Type != "rate_limit_exceeded" || body.Error.Limit != "tokens" || body.Estimate.Cost != 108 ||
		body.Error.RetryAfterMS < 28_000 || body.Error.RetryAfterMS > 33_000 {
		t.Fatalf("429 body: %s", res.Body)
	}
	if got, want := res.Header().Get("Retry-After"), strconv.FormatInt((body.Error.RetryAfterMS+999)/1000, 10); got != want {
		t.Fatalf("Retry-After %q, want %q (whole seconds, rounded up)", got, want)
	}
	if rem := res.Header().Get("X-RateLimit-Remaining-Tokens"); rem < "42" || rem > "46" || len(rem) != 2 {
		t.Fatalf("headers %v", res.Header())
	}
	if after, seq2 := b.balance(t, "acme"); after != before || seq2 != seq {
		t.Fatal("a rejection changed the balance or the ledger")
	}
}

func TestRequestTooLargeIs422(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	key := b.tenant(t, "acme", lim(100, "100"))
	res := b.call(t, key, http.MethodPost, "/v1/admissions", chat(200, "hi"))
	if res.Code != http.StatusUnprocessableEntity {
		t.Fatalf("%d %s", res.Code, res.Body)
	}
	if e := res.errorBody(); e.Error.Type != "request_too_large" || !strings.Contains(res.Body.String(), `"estimate"`) {
		t.Fatalf("body %s", res.Body)
	}
	if _, seq := b.balance(t, "acme"); seq != 1 {
		t.Fatal("a 422 wrote to the ledger")
	}
}

func TestBadInputIs4xxWithFieldAndNoDebit(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, func(c *testConfig) { c.BodyLimit = 64 << 10 })
	key := b.tenant(t, "acme", lim(1_000_000, "1"))
	before, seq := b.balance(t, "acme")

	huge := `{"model":"gpt-4o","messages":[` + strings.TrimSuffix(strings.Repeat(`{"role":"user","content":""},`, 10001), ",") + `]}`
	tests := []struct {
		name, body, field string
		status            int
		headers           []string
	}{
		{"malformed JSON", `{"model":"gpt-4o",`, "body", 400, nil},
		{"not an object", `[1,2]`, "body", 400, nil},
		{"model wrong type", `{"model":4,"messages":[{"role":"user","content":"x"}]}`, "model", 400, nil},
		{"missing model", `{"messages":[{"role":"user","content":"x"}]}`, "model", 400, nil},
		{"no messages", `{"model":"gpt-4o"}`, "messages", 400, nil},
		{"empty messages", `{"model":"gpt-4o","messages":[]}`, "messages", 400, nil},
		{"role wrong type", `{"model":"gpt-4o","messages":[{"role":1,"content":"x"}]}`, "messages[0].role", 400, nil},
		{"negative max_tokens", `{"model":"gpt-4o","messages":[{"role":"user","content":"x"}],"max_tokens":-1}`, "max_tokens", 400, nil},
		{"zero max_tokens", `{"model":"gpt-4o","messages":[{"role":"user","content":"x"}],"max_tokens":0}`, "max_tokens", 400, nil},
		{"absurd max_tokens", `{"model":"gpt-4o","messages":[{"role":"user","content":"x"}],"max_tokens":99999999999}`, "max_tokens", 400, nil},
		{"fractional max_tokens", `{"model":"gpt-4o","messages":[{"role":"user","content":"x"}],"max_tokens":1.5}`, "max_tokens", 400, nil},
		{"max_tokens as string", `{"model":"gpt-4o","messages":[{"role":"user","content":"x"}],"max_tokens":"10"}`, "max_tokens", 400, nil},
		{"invalid UTF-8", "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"a\xff\xfeb\"}]}", "messages[0].content", 400, nil},
		{"huge messages array", huge, "", 413, nil},
		{"oversized body", `{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("x", 70<<10) + `"}]}`, "", 413, nil},
		{"bad Idempotency-Key", chat(10, "x"), "Idempotency-Key", 400, []string{"Idempotency-Key", "has space"}},
		{"long Idempotency-Key", chat(10, "x"), "Idempotency-Key", 400, []string{"Idempotency-Key", strings.Repeat("k", 256)}},
		{"negative max_wait_ms", `{"model":"gpt-4o","messages":[{"role":"user","content":"x"}],"max_wait_ms":-5}`, "max_wait_ms", 400, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := b.call(t, key, http.MethodPost, "/v1/admissions", tt.body, tt.headers...)
			if res.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", res.Code, tt.status, res.Body)
			}
			e := res.errorBody()
			if tt.field != "" && e.Error.Field != tt.field {
				t.Fatalf("field %q, want %q: %s", e.Error.Field, tt.field, res.Body)
			}
		})
	}
	// A smaller messages array over the entry cap, within the body limit.
	b2 := setupAPI(t, nil)
	key2 := b2.tenant(t, "acme", lim(1_000_000, "1"))
	res := b2.call(t, key2, http.MethodPost, "/v1/admissions", huge)
	if res.Code != http.StatusBadRequest || res.errorBody().Error.Field != "messages" {
		t.Fatalf("10001 messages: %d %s", res.Code, res.Body)
	}
	for _, settle := range []struct{ body, field string }{
		{`{}`, "usage"},
		{`{"usage":{"prompt_tokens":-1,"completion_tokens":2}}`, "usage.prompt_tokens"},
		{`{"usage":{"prompt_tokens":"1","completion_tokens":2}}`, "usage.prompt_tokens"},
		{`{"usage":{"prompt_tokens":1}}`, "usage.completion_tokens"},
		{`{"usage":{"prompt_tokens":1,"input_tokens":2,"completion_tokens":2}}`, "usage.input_tokens"},
		{`not json`, "body"},
	} {
		res := b.call(t, key, http.MethodPost, "/v1/admissions/adm_nothing/settle", settle.body)
		if res.Code != http.StatusBadRequest || res.errorBody().Error.Field != settle.field {
			t.Fatalf("settle %s: %d %s", settle.body, res.Code, res.Body)
		}
	}
	if after, seq2 := b.balance(t, "acme"); after != before || seq2 != seq {
		t.Fatalf("bad input debited or wrote the ledger: %d->%d, seq %d->%d", before, after, seq, seq2)
	}
	// The server is still up.
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(10, "x")); r.Code != http.StatusCreated {
		t.Fatalf("after bad input: %d %s", r.Code, r.Body)
	}
}

func TestIdempotentRetryOverHTTP(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	key := b.tenant(t, "acme", lim(1000, "1"))
	first := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "x"), "Idempotency-Key", "req-42")
	again := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "x"), "Idempotency-Key", "req-42")
	if first.Code != 201 || again.Code != 201 || first.Body.String() != again.Body.String() || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry:\n%d %s\n%d %s", first.Code, first.Body, again.Code, again.Body)
	}
	other := b.call(t, key, http.MethodPost, "/v1/admissions", chat(101, "x"), "Idempotency-Key", "req-42")
	if other.Code != http.StatusConflict || other.errorBody().Error.Type != "idempotency_conflict" {
		t.Fatalf("reused key: %d %s", other.Code, other.Body)
	}
	if _, seq := b.balance(t, "acme"); seq != 2 {
		t.Fatalf("ledger has %d entries, want 2 (tenant, one reserve)", seq)
	}
}

func TestReleaseAndConflicts(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	key := b.tenant(t, "acme", lim(10_000, "0.001"))
	b.call(t, key, http.MethodPost, "/v1/admissions", chat(5000, "room below capacity, so the refund is whole"))
	var a admitted
	b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "x")).json(&a)
	res := b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/release", "")
	var rel struct {
		State   string      `json:"state"`
		Applied json.Number `json:"applied_delta"`
	}
	res.json(&rel)
	if res.Code != 200 || rel.State != "released" || rel.Applied != json.Number(strconv.FormatInt(a.Estimate.Cost, 10)) {
		t.Fatalf("release: %d %s", res.Code, res.Body)
	}
	if r := b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/settle", `{"usage":{"prompt_tokens":1,"completion_tokens":1}}`); r.Code != http.StatusConflict {
		t.Fatalf("settle after release: %d %s", r.Code, r.Body)
	}
	if r := b.call(t, key, http.MethodGet, "/v1/admissions/"+a.ID, ""); !strings.Contains(r.Body.String(), `"state":"released"`) {
		t.Fatalf("get after release: %s", r.Body)
	}
}

func TestOtherTenantsAdmission404(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	acme := b.tenant(t, "acme", lim(1000, "1"))
	globex := b.tenant(t, "globex", lim(1000, "1"))
	var a admitted
	b.call(t, acme, http.MethodPost, "/v1/admissions", chat(10, "x")).json(&a)
	for _, c := range []struct{ method, path, body string }{
		{http.MethodGet, "/v1/admissions/" + a.ID, ""},
		{http.MethodPost, "/v1/admissions/" + a.ID + "/settle", `{"usage":{"prompt_tokens":1,"completion_tokens":1}}`},
		{http.MethodPost, "/v1/admissions/" + a.ID + "/release", ""},
	} {
		if r := b.call(t, globex, c.method, c.path, c.body); r.Code != http.StatusNotFound {
			t.Fatalf("%s %s as another tenant: %d %s", c.method, c.path, r.Code, r.Body)
		}
	}
	// No header or body field can name another tenant.
	r := b.call(t, globex, http.MethodPost, "/v1/admissions", `{"model":"gpt-4o","tenant":"acme","tenant_id":"acme","messages":[{"role":"user","content":"x"}],"max_tokens":5}`, "X-Tenant-ID", "acme")
	if r.Code != http.StatusCreated {
		t.Fatalf("%d %s", r.Code, r.Body)
	}
	if _, seq := b.balance(t, "acme"); seq != 2 {
		t.Fatal("acme was charged for globex's request")
	}
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, func(c *testConfig) { c.AuthFailuresPerSecond, c.AuthFailureBurst = 0.001, 5 })
	key := b.tenant(t, "acme", lim(1000, "1"))
	wrong := key[:len(key)-1] + map[bool]string{true: "b", false: "a"}[strings.HasSuffix(key, "a")]
	for _, k := range []string{"", "nonsense", "tg_short", wrong} {
		res := b.call(t, k, http.MethodGet, "/v1/budget", "")
		if res.Code != http.StatusUnauthorized || res.errorBody().Error.Type != "unauthorized" || res.Header().Get("WWW-Authenticate") == "" {
			t.Fatalf("key %q: %d %s", k, res.Code, res.Body)
		}
	}
	if res := b.call(t, key, http.MethodGet, "/v1/budget", ""); res.Code != http.StatusOK {
		t.Fatalf("valid key: %d %s", res.Code, res.Body)
	}
	// Three malformed keys above; the fifth spends the address's burst of
	// malformed keys, and the sixth is refused before anything else.
	b.call(t, "tg_nope", http.MethodGet, "/v1/budget", "")
	b.call(t, "tg_nope", http.MethodGet, "/v1/budget", "")
	res := b.call(t, "tg_nope", http.MethodGet, "/v1/budget", "")
	if res.Code != http.StatusTooManyRequests || !strings.Contains(res.Body.String(), `"limit":"auth"`) || res.Header().Get("Retry-After") == "" {
		t.Fatalf("after 5 failures: %d %s", res.Code, res.Body)
	}
	// Wrong secrets of one key spend that key's bucket from this address.
	for range 4 {
		if res := b.call(t, wrong, http.MethodGet, "/v1/budget", ""); res.Code != http.StatusUnauthorized {
			t.Fatalf("wrong secret: %d %s", res.Code, res.Body)
		}
	}
	if res := b.call(t, wrong, http.MethodGet, "/v1/budget", ""); res.Code != http.StatusTooManyRequests {
		t.Fatalf("sixth wrong secret: %d %s", res.Code, res.Body)
	}
	// Revoked keys are refused.
	b2 := setupAPI(t, nil)
	key2 := b2.tenant(t, "globex", lim(1000, "1"))
	id := strings.Split(strings.TrimPrefix(key2, "tg_"), "_")[0]
	if err := credential.KeyRevoke(ctx, b2.pool, "globex", id); err != nil {
		t.Fatal(err)
	}
	if res := b2.call(t, key2, http.MethodGet, "/v1/budget", ""); res.Code != http.StatusUnauthorized {
		t.Fatalf("revoked key: %d", res.Code)
	}
}

func TestMaxWaitWaitsForRefill(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, func(c *testConfig) { c.MaxWaiters = 1 })
	key := b.tenant(t, "acme", lim(100, "20")) // 1 token per 50 ms
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(90, "x")); r.Code != 201 {
		t.Fatalf("%d %s", r.Code, r.Body)
	}
	// About 40 more tokens are needed: about 2 s. A 50 ms wait cannot cover
	// it, so the answer is an immediate 429.
	wait := func(ms int) string {
		return fmt.Sprintf(`{"model":"gpt-4o","messages":[{"role":"user","content":"x"}],"max_tokens":40,"max_wait_ms":%d}`, ms)
	}
	start := time.Now()
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", wait(50)); r.Code != 429 || time.Since(start) > 2*time.Second {
		t.Fatalf("short wait: %d after %s", r.Code, time.Since(start))
	}
	start = time.Now()
	r := b.call(t, key, http.MethodPost, "/v1/admissions", wait(10000))
	if took := time.Since(start); r.Code != 201 || took < 500*time.Millisecond || took > 8*time.Second {
		t.Fatalf("waiting admission: %d after %s: %s", r.Code, took, r.Body)
	}

	// A disconnecting caller stops waiting and is not charged.
	_, seq := b.balance(t, "acme")
	cctx, cancel := context.WithCancel(ctx)
	req := httptest.NewRequestWithContext(cctx, http.MethodPost, "/v1/admissions", strings.NewReader(wait(5000)))
	req.Header.Set("Authorization", "Bearer "+key)
	done := make(chan int)
	go func() {
		rec := httptest.NewRecorder()
		b.srv.ServeHTTP(rec, req)
		done <- rec.Code
	}()
	time.AfterFunc(50*time.Millisecond, cancel)
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("a cancelled waiter kept waiting")
	}
	if _, seq2 := b.balance(t, "acme"); seq2 != seq {
		t.Fatal("a cancelled waiter was charged")
	}
}

func TestWaitQueueIsBounded(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, func(c *testConfig) { c.MaxWaiters = 1 })
	// 1.5 tokens/s: the first waiter below needs about 7 s of refill, and
	// the second, queued behind it, about 15 s: both within their 20 s
	// max_wait, so a refusal at once can only be the full queue.
	l := lim(100, "1.5")
	b.tenant(t, "acme", l)
	_, key, err := credential.KeyCreate(ctx, b.pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(90, "x")); r.Code != 201 {
		t.Fatal(r.Body)
	}
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"x"}],"max_tokens":5,"max_wait_ms":20000}`
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	first := make(chan int, 1)
	go func() {
		req := httptest.NewRequestWithContext(wctx, http.MethodPost, "/v1/admissions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		rec := httptest.NewRecorder()
		b.srv.ServeHTTP(rec, req)
		first <- rec.Code
	}()
	// The first waiter holds the only place: the gauge says it waits.
	waiting := func() bool {
		return strings.Contains(b.call(t, "", http.MethodGet, "/metrics", "").Body.String(), "\ntokengate_waiting_callers 1\n")
	}
	await.Until(t, 10*time.Second, "the first caller to reach the wait", func() bool {
		select {
		case code := <-first:
			t.Fatalf("the first caller was answered (%d) instead of waiting", code)
		default:
		}
		return waiting()
	}, nil)
	// The second, which could wait as long, is refused at once: 429 while
	// the first still waits (its refill is seconds away).
	r := b.call(t, key, http.MethodPost, "/v1/admissions", body)
	if r.Code != http.StatusTooManyRequests {
		t.Fatalf("second waiter: %d %s", r.Code, r.Body)
	}
	select {
	case code := <-first:
		t.Fatalf("the first waiter was answered (%d) before the second's refusal", code)
	default:
	}
	if !waiting() {
		t.Fatal("the first waiter left the queue")
	}
	cancel()
	<-first
}

func TestAdmissionMetrics(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	key := b.tenant(t, "acme", lim(100, "0.001"))
	b.call(t, key, http.MethodPost, "/v1/admissions", chat(90, "x"))
	b.call(t, key, http.MethodPost, "/v1/admissions", chat(90, "x"))
	res := b.call(t, "", http.MethodGet, "/metrics", "")
	for _, want := range []string{
		`tokengate_admissions_total{face="api",limit="",outcome="admitted"} 1`,
		`tokengate_admissions_total{face="api",limit="tokens",outcome="rejected"} 1`,
		`tokengate_admission_duration_seconds_count{face="api"} 2`,
	} {
		if !strings.Contains(res.Body.String(), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestSettleCountsCachedInputAtItsWeight: a settle with OpenAI's
// prompt_tokens_details (or the Responses API's input_tokens_details)
// counts cached input tokens at the model's cached-input weight; a cached
// count outside 0..input is a 400 naming it, and charges nothing.
func TestSettleCountsCachedInputAtItsWeight(t *testing.T) {
	t.Parallel()
	est := estimator.New(nil)
	table, err := estimator.DefaultTable().With([]estimator.Model{{Name: "gpt-4o", Encoding: estimator.EncodingO200K,
		InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne, CachedInputWeightMicro: estimator.WeightOne / 2,
		DefaultOutputTokens: 16384, ContextWindow: 128000, PartTokens: 765}})
	if err != nil {
		t.Fatal(err)
	}
	est.SetTable(table)
	b := setupAPI(t, func(c *testConfig) { c.Estimator = est })
	key := b.tenant(t, "acme", lim(100_000, "0.000001"))
	for _, c := range []struct{ usage, field string }{
		{`{"prompt_tokens":40,"completion_tokens":25,"prompt_tokens_details":{"cached_tokens":41}}`, "usage.prompt_tokens_details.cached_tokens"},
		{`{"input_tokens":40,"output_tokens":25,"input_tokens_details":{"cached_tokens":-1}}`, "usage.input_tokens_details.cached_tokens"},
		{`{"input_tokens":40,"output_tokens":25,"input_tokens_details":{"cached_tokens":"many"}}`, "usage.input_tokens_details.cached_tokens"},
	} {
		var a admitted
		b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hello")).json(&a)
		before, seq := b.balance(t, "acme")
		r := b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/settle", `{"usage":`+c.usage+`}`)
		if r.Code != http.StatusBadRequest || r.errorBody().Error.Field != c.field {
			t.Fatalf("%s: %d %s, want 400 naming %s", c.usage, r.Code, r.Body, c.field)
		}
		if after, seq2 := b.balance(t, "acme"); after != before || seq2 != seq {
			t.Fatalf("%s: a bad settle moved the balance or the ledger", c.usage)
		}
		b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/release", "")
	}
	for _, usage := range []string{
		`{"prompt_tokens":40,"completion_tokens":25,"prompt_tokens_details":{"cached_tokens":30}}`,
		`{"input_tokens":40,"output_tokens":25,"input_tokens_details":{"cached_tokens":30}}`,
	} {
		var a admitted
		b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hello")).json(&a)
		r := b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/settle", `{"usage":`+usage+`}`)
		// 10 uncached + 30 cached at half weight = 25 input tokens; 25 output.
		if r.Code != http.StatusOK || !strings.Contains(r.Body.String(), `"actual":{"input_tokens":25,"output_tokens":25,"cost":50}`) {
			t.Fatalf("%s: %d %s", usage, r.Code, r.Body)
		}
	}
}

// TestCachedInputCostsNoExtraRead: a settle with cached input tokens costs
// Postgres the round trips of one without: the discount is priced in the
// settle's own transaction, with the admission it locks, instead of a read
// of the admission beside it.
func TestCachedInputCostsNoExtraRead(t *testing.T) {
	t.Parallel()
	rt := &pgtest.RoundTrips{}
	pool := pgtest.New(t, rt.Trace)
	srv, rep := newServer(t, &testConfig{replicaConfig: replica.Config{DB: pool}})
	b := &apiBundle{pool: pool, srv: srv, rep: rep, store: rep.Store}
	key := b.tenant(t, "acme", lim(100_000, "1"))
	settle := func(usage string) int64 {
		t.Helper()
		var a admitted
		if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hello")); r.Code != http.StatusCreated {
			t.Fatalf("admission: %d %s", r.Code, r.Body)
		} else {
			r.json(&a)
		}
		before := rt.Count()
		if r := b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/settle", `{"usage":`+usage+`}`); r.Code != http.StatusOK {
			t.Fatalf("settle: %d %s", r.Code, r.Body)
		}
		return rt.Count() - before
	}
	// The fewest of three tries: a refresh of the store's cached pool
	// routes or alert rules (every 2 s) may land in any one settle.
	fewest := func(usage string) int64 {
		n := settle(usage)
		for range 2 {
			n = min(n, settle(usage))
		}
		return n
	}
	settle(`{"prompt_tokens":40,"completion_tokens":25}`) // the key is verified and cached
	plain := fewest(`{"prompt_tokens":40,"completion_tokens":25}`)
	cached := fewest(`{"prompt_tokens":40,"completion_tokens":25,"prompt_tokens_details":{"cached_tokens":30}}`)
	if cached != plain {
		t.Fatalf("a settle with cached tokens took %d round trips, one without %d", cached, plain)
	}
}

// TestEmbeddingsBodyIsChargedForItsInputAlone: an embeddings body admitted
// through the HTTP API (no route to say what it is) is read as one by its
// model's entry in the table: each input within the window on its own, the
// batch's exact sum as the estimate, and no output reserved. Read as a
// Responses body, this batch was refused for exceeding the window together.
func TestEmbeddingsBodyIsChargedForItsInputAlone(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	key := b.tenant(t, "acme", lim(100_000, "0.001"))
	ids := func(n int) string { return "[" + strings.TrimSuffix(strings.Repeat("17,", n), ",") + "]" }

	body := `{"model":"text-embedding-3-small","input":[` + ids(5000) + `,` + ids(5000) + `,` + ids(3000) + `]}`
	res := b.call(t, key, http.MethodPost, "/v1/admissions", body)
	if res.Code != http.StatusCreated {
		t.Fatalf("admission: %d %s", res.Code, res.Body)
	}
	var a admitted
	res.json(&a)
	if a.Estimate.InputTokens != 13000 || a.Estimate.OutputTokens != 0 || a.Estimate.Cost != 13000 || a.Estimate.Approximate {
		t.Fatalf("estimate: %s", res.Body)
	}

	// One input over the window: refused, naming it, and nothing charged.
	res = b.call(t, key, http.MethodPost, "/v1/admissions", `{"model":"text-embedding-3-small","input":[`+ids(5)+`,`+ids(8192)+`]}`)
	if e := res.errorBody(); res.Code != http.StatusBadRequest || e.Error.Field != "input[1]" {
		t.Fatalf("an input over the window: %d %s", res.Code, res.Body)
	}
	if _, seq := b.balance(t, "acme"); seq != 2 {
		t.Fatalf("%d ledger entries, want the tenant's and one reserve", seq)
	}

	// A Responses body for a chat model still reserves its output.
	res = b.call(t, key, http.MethodPost, "/v1/admissions", `{"model":"gpt-4o","input":"hi","max_output_tokens":50}`)
	res.json(&a)
	if res.Code != http.StatusCreated || a.Estimate.OutputTokens != 50 {
		t.Fatalf("responses body: %d %s", res.Code, res.Body)
	}
}

// TestSettleCountsAnthropicCacheUsage: a settle may carry Anthropic's usage
// as its Messages API reports it. Its input_tokens leaves the prompt
// cache's reads and writes out, so they are added to the input and priced
// at the model's cache weights (Claude's seeded 0.1, 1.25 and 2): dropping
// them would charge a cached call a fraction of its input.
func TestSettleCountsAnthropicCacheUsage(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	key := b.tenant(t, "acme", lim(100_000, "0.000001"))
	admit := func() admitted {
		var a admitted
		r := b.call(t, key, http.MethodPost, "/v1/admissions", `{"model":"claude-sonnet-4-5","max_tokens":100,"messages":[{"role":"user","content":"hello"}]}`)
		if r.Code != http.StatusCreated {
			t.Fatalf("admission: %d %s", r.Code, r.Body)
		}
		r.json(&a)
		return a
	}
	for _, c := range []struct{ usage, field string }{
		{`{"input_tokens":100,"output_tokens":40,"cache_creation_input_tokens":200,"cache_creation":{"ephemeral_5m_input_tokens":50,"ephemeral_1h_input_tokens":100}}`, "usage.cache_creation"},
		{`{"input_tokens":100,"output_tokens":40,"cache_read_input_tokens":-1}`, "usage.cache_read_input_tokens"},
		{`{"input_tokens":100,"output_tokens":40,"cache_read_input_tokens":5,"input_tokens_details":{"cached_tokens":5}}`, "usage.cache_read_input_tokens"},
		{`{"input_tokens":100,"output_tokens":40,"cache_creation":{"ephemeral_1h_input_tokens":"x"}}`, "usage.cache_creation.ephemeral_1h_input_tokens"},
	} {
		a := admit()
		before, seq := b.balance(t, "acme")
		r := b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/settle", `{"usage":`+c.usage+`}`)
		if r.Code != http.StatusBadRequest || r.errorBody().Error.Field != c.field {
			t.Fatalf("%s: %d %s, want 400 naming %s", c.usage, r.Code, r.Body, c.field)
		}
		if after, seq2 := b.balance(t, "acme"); after != before || seq2 != seq {
			t.Fatalf("%s: a bad settle moved the balance or the ledger", c.usage)
		}
		b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/release", "")
	}
	for _, c := range []struct {
		usage string
		input int64
	}{
		// 100 + ceil(1000 x 0.1 + 50 x 1.25 + 150 x 2) = 563.
		{`{"input_tokens":100,"output_tokens":40,"cache_read_input_tokens":1000,"cache_creation_input_tokens":200,
			"cache_creation":{"ephemeral_5m_input_tokens":50,"ephemeral_1h_input_tokens":150}}`, 563},
		// No split: every write for 5 minutes. 100 + ceil(100 + 250) = 450.
		{`{"input_tokens":100,"output_tokens":40,"cache_read_input_tokens":1000,"cache_creation_input_tokens":200}`, 450},
		// The split alone. 100 + 300 = 400.
		{`{"input_tokens":100,"output_tokens":40,"cache_creation":{"ephemeral_1h_input_tokens":150}}`, 400},
	} {
		a := admit()
		r := b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/settle", `{"usage":`+c.usage+`}`)
		want := fmt.Sprintf(`"actual":{"input_tokens":%d,"output_tokens":40,"cost":%d}`, c.input, c.input+40)
		if r.Code != http.StatusOK || !strings.Contains(r.Body.String(), want) {
			t.Fatalf("%s: %d %s, want %s", c.usage, r.Code, r.Body, want)
		}
		// The same usage again is the same settle.
		if again := b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/settle", `{"usage":`+c.usage+`}`); again.Code != http.StatusOK || again.Body.String() != r.Body.String() {
			t.Fatalf("repeated settle: %d %s", again.Code, again.Body)
		}
	}
}
