package web_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestNULInFormsIsA400NamingTheField: a NUL byte in a dashboard form field,
// path or query never reaches Postgres: the answer is a 400 naming the
// field (the login form again for /login), nothing changes, and nothing is
// logged as a server error.
func TestNULInFormsIsA400NamingTheField(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.tenant(t, "acme", limits(1000, "1"))

	anon := b.client(t, "192.0.2.31")
	rec := anon.post("/login", url.Values{"token": {"tga_\x00"}})
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "token") || !strings.Contains(rec.Body.String(), "NUL") ||
		!strings.Contains(rec.Body.String(), `name="token"`) {
		t.Fatalf("login with a NUL: %d %s, want the login form again with a 400 naming the token", rec.Code, rec.Body)
	}

	c := b.client(t, "192.0.2.32")
	c.mustLogin()
	csrf := c.csrf("/")
	entries := b.count(t, `SELECT count(*) FROM ledger_entries`)
	for _, tc := range []struct {
		method, path string
		form         url.Values
		field        string
	}{
		{http.MethodPost, "/tenants/acme/adjust", url.Values{"tokens": {"10"}, "reason": {"credit\x00"}}, "reason"},
		{http.MethodPost, "/tenants/acme/disable", url.Values{"reason": {"\x00"}}, "reason"},
		{http.MethodPost, "/tenants", url.Values{"id": {"b\x00"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1"}}, "id"},
		{http.MethodPost, "/models", url.Values{"name": {"m\x00"}, "encoding": {"o200k_base"}, "input_weight": {"1"}, "output_weight": {"1"},
			"default_output_tokens": {"10"}, "context_window": {"100"}, "part_tokens": {"1"}}, "name"},
		{http.MethodPost, "/tenants/ac%00me/adjust", url.Values{"tokens": {"10"}, "reason": {"x"}}, "id"},
		{http.MethodGet, "/tenants/ac%00me", nil, "id"},
		{http.MethodGet, "/ledger?tenant=%00", nil, "tenant"},
		{http.MethodGet, "/ledger?model=gpt%00&kind=settle", nil, "model"},
	} {
		if tc.form != nil {
			tc.form.Set("csrf", csrf)
		}
		rec := c.do(tc.method, tc.path, tc.form)
		body := rec.Body.String()
		if rec.Code != http.StatusBadRequest || !strings.Contains(body, "“"+tc.field+"”") || !strings.Contains(body, "NUL") ||
			!strings.Contains(rec.Header().Get("Content-Type"), "text/html") {
			t.Errorf("%s %s: %d %s, want a 400 page naming %q", tc.method, tc.path, rec.Code, body, tc.field)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM ledger_entries`); n != entries {
		t.Errorf("%d ledger entries after refused forms, want %d", n, entries)
	}
	for _, line := range strings.Split(b.logs.String(), "\n") {
		if strings.Contains(line, `"level":"ERROR"`) {
			t.Errorf("bad input logged as a server error: %s", line)
		}
	}
}
