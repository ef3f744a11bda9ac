package api_test

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// A wait refill can never end (a millionth of a token a second towards a
// deficit of thousands: longer than a time.Duration holds) used to wrap
// around: a negative reset header and "Retry-After: 1". It says never:
// no Retry-After, no reset, retry_never in the body (issue 36, P9).
func TestHugeWaitSaysNeverNotOneSecond(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	key := b.tenant(t, "acme", lim(100_000, "0.000001"))
	for i := range 6 {
		r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(16_000, "hi"))
		if r.Code != http.StatusCreated {
			t.Fatalf("admission %d: %d %s", i, r.Code, r.Body)
		}
		if reset := r.Header().Get("X-Ratelimit-Reset-Tokens"); reset != "" {
			t.Fatalf("admission %d: X-Ratelimit-Reset-Tokens %q for a bucket that never refills in time", i, reset)
		}
	}
	res := b.call(t, key, http.MethodPost, "/v1/admissions", chat(16_000, "hi"))
	if res.Code != http.StatusTooManyRequests {
		t.Fatalf("%d %s", res.Code, res.Body)
	}
	var body struct {
		Error struct {
			Type         string `json:"type"`
			Message      string `json:"message"`
			RetryAfterMS *int64 `json:"retry_after_ms"`
			RetryNever   bool   `json:"retry_never"`
		} `json:"error"`
	}
	res.json(&body)
	h := res.Header()
	if body.Error.Type != "rate_limit_exceeded" || !body.Error.RetryNever || body.Error.RetryAfterMS != nil || !strings.Contains(body.Error.Message, "refills too slowly") {
		t.Fatalf("body %s", res.Body)
	}
	if h.Get("Retry-After") != "" || h.Get("X-Ratelimit-Reset-Tokens") != "" || h.Get("X-Should-Retry") != "false" {
		t.Fatalf("headers %v", h)
	}
	for name, v := range h {
		if strings.HasPrefix(v[0], "-") {
			t.Errorf("%s: %q is negative", name, v[0])
		}
	}
}

// A model without a price, refused where a money window must count it, is
// a refusal by policy: counted invalid, never error (the bucket of a store
// failure) (issue 36, item 7).
func TestUnpricedModelIsCountedInvalid(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	key := b.tenant(t, "acme", moneyWindow(t, "10"))
	res := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "hi"))
	if res.Code != http.StatusBadRequest || res.errorBody().Error.Field != "model" {
		t.Fatalf("%d %s", res.Code, res.Body)
	}
	m := b.call(t, "", http.MethodGet, "/metrics", "").Body.String()
	if !strings.Contains(m, `tokengate_admissions_total{face="api",limit="",outcome="invalid"} 1`) {
		t.Errorf("metrics lack the invalid outcome:\n%s", grepLines(m, "tokengate_admissions_total"))
	}
	if strings.Contains(m, `outcome="error"`) {
		t.Errorf("a refusal by policy is counted as an error:\n%s", grepLines(m, "tokengate_admissions_total"))
	}
}

// An unknown query parameter, or an unknown value of a known one, is a 400
// naming it and what the route accepts, never silently ignored (issue 36,
// item 7: ?group=day on the report was answered as if it applied).
func TestUnknownQueryParameterIs400(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "ops")
	key := b.tenant(t, "acme", lim(1000, "10"))
	from := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	for _, c := range []struct {
		key, path, field, says string
	}{
		{"", "/v1/admin/reports/drift?group=day", "group", "tenant, model, by, from, to"},
		{"", "/v1/admin/reports/drift?by=day", "by", `"day": must be model`},
		{"", "/v1/admin/ledger?order=latest", "order", "newest or oldest"},
		{"", "/v1/admin/ledger?tenant=acme&page=2", "page", "cursor"},
		{"", "/v1/admin/ledger/export?fmt=csv", "fmt", "format"},
		{"", "/v1/admin/tenants?limit=5", "limit", "takes none"},
		{"", "/v1/admin/prices?when=" + from, "when", "at, model"},
		{"", "/v1/admin/alerts/events?status=failed", "status", "state"},
		{key, "/v1/ledger?order=newest&since=" + from, "since", "from"},
		{key, "/v1/budget?window=daily", "window", "takes none"},
	} {
		var r response
		if c.key != "" {
			r = b.call(t, c.key, http.MethodGet, c.path, "")
		} else {
			r = b.adminCall(t, token, http.MethodGet, c.path, nil)
		}
		if r.Code != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", c.path, r.Code, r.Body)
			continue
		}
		e := r.errorBody().Error
		if e.Field != c.field || !strings.Contains(e.Message, c.says) {
			t.Errorf("%s: field %q message %q, want %q saying %q", c.path, e.Field, e.Message, c.field, c.says)
		}
	}
	// The parameters a route reads still work.
	for _, path := range []string{"/v1/admin/reports/drift?by=model&from=" + from, "/v1/admin/ledger?order=oldest&tenant=acme&limit=5"} {
		if r := b.adminCall(t, token, http.MethodGet, path, nil); r.Code != http.StatusOK {
			t.Errorf("%s: %d %s", path, r.Code, r.Body)
		}
	}
	if r := b.call(t, key, http.MethodGet, "/v1/ledger?order=newest&from="+from, ""); r.Code != http.StatusOK {
		t.Errorf("/v1/ledger: %d %s", r.Code, r.Body)
	}
}
