package api_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// exhaustedBody is the API's answer to an exhausted budget window.
type exhaustedBody struct {
	Error struct {
		Type         string `json:"type"`
		Message      string `json:"message"`
		Limit        string `json:"limit"`
		Level        string `json:"level"`
		Window       string `json:"window"`
		RetryAfterMS int64  `json:"retry_after_ms"`
		Budget       *struct {
			Window    string    `json:"window"`
			Counts    string    `json:"counts"`
			Spent     string    `json:"spent"`
			Limit     string    `json:"limit"`
			Cap       string    `json:"cap"`
			Remaining string    `json:"remaining"`
			Cost      string    `json:"cost"`
			Currency  string    `json:"currency"`
			ResetsAt  time.Time `json:"resets_at"`
		} `json:"budget"`
	} `json:"error"`
}

func (r response) exhausted() exhaustedBody {
	r.t.Helper()
	var b exhaustedBody
	d := json.NewDecoder(strings.NewReader(r.Body.String()))
	d.UseNumber()
	var raw map[string]map[string]any
	if err := d.Decode(&raw); err != nil {
		r.t.Fatalf("body %q: %v", r.Body.String(), err)
	}
	// Amounts are JSON numbers: read them as their exact text.
	if bud, ok := raw["error"]["budget"].(map[string]any); ok {
		for k, v := range bud {
			if n, ok := v.(json.Number); ok {
				bud[k] = n.String()
			}
		}
	}
	j, _ := json.Marshal(raw)
	if err := json.Unmarshal(j, &b); err != nil {
		r.t.Fatalf("body %q: %v", r.Body.String(), err)
	}
	return b
}

// priced gives gpt-4o a price (2.50 in, 10.00 out per million tokens)
// from an hour ago.
func (b *apiBundle) priced(t testing.TB) {
	t.Helper()
	if _, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, effective_from, input_micro, output_micro, created_by)
		VALUES ('gpt-4o', now() - interval '1 hour', 2500000, 10000000, 'test')`); err != nil {
		t.Fatal(err)
	}
}

// moneyWindow is limits with a large token bucket (2,000,000, which must
// never show as room) and one daily money window of amount, in UTC.
func moneyWindow(t testing.TB, amount string) rule.Limits {
	t.Helper()
	l := lim(2_000_000, "1000")
	ws, err := rule.ParseWindows([]rule.WindowJSON{{Name: "daily", Unit: "day", Money: &amount}})
	if err != nil {
		t.Fatal(err)
	}
	l.Windows = ws
	return l
}

// moneyOf is what one chat(100, "hi") costs: what a first admission of a
// probe tenant moved its money window.
func (b *apiBundle) moneyOf(t testing.TB, body string) int64 {
	t.Helper()
	key := b.tenant(t, "probe", moneyWindow(t, "1000"))
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", body); r.Code != http.StatusCreated {
		t.Fatalf("probe: %d %s", r.Code, r.Body)
	}
	var bud struct {
		Balances struct {
			Windows []struct {
				Used json.Number `json:"used"`
			} `json:"windows"`
		} `json:"balances"`
	}
	b.call(t, key, http.MethodGet, "/v1/budget", "").json(&bud)
	m, err := rule.ParseRate(bud.Balances.Windows[0].Used.String())
	if err != nil || m <= 0 {
		t.Fatalf("probe used %v: %v", bud.Balances.Windows[0].Used, err)
	}
	return m
}

// Running out of a money window is told apart from a rate limit (issue 36,
// item 5): its own type, naming the window, what it spent and its cap in
// money, the currency and the reset, with headers of the window that bound
// (never the token bucket's 2,000,000 remaining) that agree with the body.
func TestMoneyWindowExhaustedIsBudgetExhausted(t *testing.T) {
	t.Parallel()
	at := time.Now()
	b := setupAPI(t, func(c *testConfig) { c.Store = account.NewStore(c.DB).WithClock(func() time.Time { return at }) })
	b.priced(t)
	body := chat(100, "hi")
	m := b.moneyOf(t, body)
	key := b.tenant(t, "acme", moneyWindow(t, rule.FormatRate(m+m/2))) // room for one, not two
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", body); r.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", r.Code, r.Body)
	}
	before, seq := b.balance(t, "acme")
	res := b.call(t, key, http.MethodPost, "/v1/admissions", body)
	if res.Code != http.StatusTooManyRequests {
		t.Fatalf("second: %d %s", res.Code, res.Body)
	}
	e := res.exhausted().Error
	resets := time.Date(at.UTC().Year(), at.UTC().Month(), at.UTC().Day()+1, 0, 0, 0, 0, time.UTC)
	if e.Type != "budget_exhausted" || e.Limit != "period_budget" || e.Window != "daily" || e.Level != "acme" || e.Budget == nil {
		t.Fatalf("body %s", res.Body)
	}
	bd := e.Budget
	if bd.Window != "daily" || bd.Counts != "money" || bd.Currency != "USD" || bd.Spent != rule.FormatRate(m) || bd.Cap != rule.FormatRate(m+m/2) ||
		bd.Limit != bd.Cap || bd.Remaining != rule.FormatRate(m/2) || bd.Cost != rule.FormatRate(m) || !bd.ResetsAt.Equal(resets) {
		t.Fatalf("budget %+v, want spent %s of %s USD, resets %s", *bd, rule.FormatRate(m), rule.FormatRate(m+m/2), resets)
	}
	if want := resets.Sub(at).Milliseconds(); e.RetryAfterMS < want || e.RetryAfterMS > want+1 {
		t.Fatalf("retry_after_ms %d, want the time to the reset, %d", e.RetryAfterMS, want)
	}
	for _, w := range []string{"daily", "money", rule.FormatRate(m) + " USD", rule.FormatRate(m+m/2) + " USD", resets.Format(time.RFC3339)} {
		if !strings.Contains(e.Message, w) {
			t.Errorf("message %q does not say %q", e.Message, w)
		}
	}
	h := res.Header()
	for name, want := range map[string]string{
		"Retry-After":                  strconv.FormatInt((e.RetryAfterMS+999)/1000, 10),
		"X-Should-Retry":               "false",
		"X-Ratelimit-Limit-Budget":     bd.Cap,
		"X-Ratelimit-Remaining-Budget": bd.Remaining,
		"X-Ratelimit-Budget-Window":    "daily",
		"X-Ratelimit-Budget-Unit":      "USD",
		// The bucket did not refuse: its 2,000,000 must not read as room.
		"X-Ratelimit-Remaining-Tokens": "",
		"X-Ratelimit-Limit-Tokens":     "",
	} {
		if got := h.Get(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if d, err := time.ParseDuration(h.Get("X-Ratelimit-Reset-Budget")); err != nil || d.Milliseconds() != e.RetryAfterMS {
		t.Errorf("X-Ratelimit-Reset-Budget %q, want %d ms: %v", h.Get("X-Ratelimit-Reset-Budget"), e.RetryAfterMS, err)
	}
	if after, seq2 := b.balance(t, "acme"); after != before || seq2 != seq {
		t.Fatal("a refusal changed the balance or the ledger")
	}
}

// A tokens window that bound tells its own remaining in OpenAI's token
// headers, not the bucket's.
func TestTokensWindowExhaustedHeadersAreTheWindows(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	l := lim(2_000_000, "1000")
	n := int64(150)
	ws, err := rule.ParseWindows([]rule.WindowJSON{{Name: "hourly", Unit: "hour", Tokens: &n}})
	if err != nil {
		t.Fatal(err)
	}
	l.Windows = ws
	key := b.tenant(t, "acme", l)
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hi")); r.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", r.Code, r.Body)
	}
	res := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hi"))
	e := res.exhausted().Error
	if res.Code != http.StatusTooManyRequests || e.Type != "budget_exhausted" || e.Budget == nil || e.Budget.Counts != "tokens" || e.Budget.Cap != "150" {
		t.Fatalf("%d %s", res.Code, res.Body)
	}
	h := res.Header()
	if h.Get("X-Ratelimit-Limit-Tokens") != "150" || h.Get("X-Ratelimit-Remaining-Tokens") != e.Budget.Remaining ||
		h.Get("X-Ratelimit-Remaining-Budget") != e.Budget.Remaining || h.Get("X-Ratelimit-Budget-Unit") != "tokens" {
		t.Fatalf("headers %v, body %s", h, res.Body)
	}
}

// Many callers exhausting one money window at once: exactly the admitted
// ones fit its cap, and every other one is told budget_exhausted, none a
// rate limit.
func TestConcurrentCallersExhaustAMoneyWindow(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	b.priced(t)
	body := chat(100, "hi")
	m := b.moneyOf(t, body)
	const fit, callers = 7, 40
	key := b.tenant(t, "acme", moneyWindow(t, rule.FormatRate(fit*m)))
	srv := httptest.NewServer(b.srv)
	defer srv.Close()

	var wg sync.WaitGroup
	codes := make([]int, callers)
	types := make([]string, callers)
	start := make(chan struct{})
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/admissions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+key)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			codes[i] = resp.StatusCode
			var e errorBody
			_ = json.NewDecoder(resp.Body).Decode(&e)
			types[i] = e.Error.Type
		}()
	}
	close(start)
	wg.Wait()
	admitted := 0
	for i := range callers {
		switch {
		case codes[i] == http.StatusCreated:
			admitted++
		case codes[i] != http.StatusTooManyRequests || types[i] != "budget_exhausted":
			t.Errorf("caller %d: %d %q, want 201 or 429 budget_exhausted", i, codes[i], types[i])
		}
	}
	var used int64
	var usage []byte
	if err := b.pool.QueryRow(ctx, `SELECT window_usage FROM tenants WHERE id = 'acme'`).Scan(&usage); err != nil {
		t.Fatal(err)
	}
	var us []struct {
		Used int64 `json:"used"`
	}
	if err := json.Unmarshal(usage, &us); err != nil || len(us) != 1 {
		t.Fatalf("window usage %s: %v", usage, err)
	}
	used = us[0].Used
	if admitted != fit || used != fit*m {
		t.Fatalf("%d admitted, window used %d; want %d admitted using exactly the cap %d", admitted, used, fit, fit*m)
	}
}

// When the bucket is short too, the exhausted window is the limit that
// binds (until its reset, not the bucket's minute): it is the one named,
// so a caller is not sent to wait a minute for the same refusal.
func TestExhaustedWindowIsNamedBeforeAShortBucket(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	b.priced(t)
	body := chat(100, "hi")
	m := b.moneyOf(t, body)
	l := moneyWindow(t, rule.FormatRate(m+m/2))
	l.TokensCapacity, l.TokensRateMicro = 150, rule.Micro // about 108 a call: the second is 66 tokens short
	key := b.tenant(t, "acme", l)
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", body); r.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", r.Code, r.Body)
	}
	res := b.call(t, key, http.MethodPost, "/v1/admissions", body)
	if e := res.exhausted().Error; res.Code != http.StatusTooManyRequests || e.Type != "budget_exhausted" || e.Window != "daily" {
		t.Fatalf("%d %s", res.Code, res.Body)
	}
}
