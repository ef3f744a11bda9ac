package web_test

import (
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/web"
)

const wantCSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

func TestUnauthenticatedPagesRedirectToLogin(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.tenant(t, "acme", limits(1000, "1"))
	c := b.client(t, "192.0.2.1")

	for path, want := range map[string]string{
		"/":                "/login",
		"/tenants/acme":    "/login?next=%2Ftenants%2Facme",
		"/models":          "/login?next=%2Fmodels",
		"/ledger?kind=tag": "/login?next=%2Fledger%3Fkind%3Dtag",
		"/ledger.csv":      "/login?next=%2Fledger.csv",
		"/alerts":          "/login?next=%2Falerts",
	} {
		rec := c.get(path)
		if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != want {
			t.Errorf("GET %s: %d to %q, want 303 to %q", path, rec.Code, rec.Header().Get("Location"), want)
		}
		if rec.Header().Get("Content-Security-Policy") != wantCSP {
			t.Errorf("GET %s: redirect without the CSP", path)
		}
	}

	rec := c.get("/ui/overview.json")
	if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Header().Get("Content-Type"), "application/json") {
		t.Errorf("live JSON without a session: %d %s, want a 401 JSON error", rec.Code, rec.Header().Get("Content-Type"))
	}

	// A state change without a session changes nothing.
	rec = c.post("/tenants", url.Values{"id": {"sneaky"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1"}, "csrf": {"x"}})
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/login" {
		t.Errorf("POST /tenants without a session: %d %q", rec.Code, rec.Header().Get("Location"))
	}
	if n := b.count(t, `SELECT count(*) FROM tenants WHERE id = 'sneaky'`); n != 0 {
		t.Errorf("a tenant was created without a session")
	}

	// The API's own routes are untouched by the dashboard.
	if rec := c.get("/healthz"); rec.Code != http.StatusOK {
		t.Errorf("/healthz: %d", rec.Code)
	}
	if rec := c.get("/v1/budget"); rec.Code != http.StatusUnauthorized || rec.Header().Get("Content-Security-Policy") != "" {
		t.Errorf("/v1/budget: %d, CSP %q: the dashboard's middleware leaked onto the API", rec.Code, rec.Header().Get("Content-Security-Policy"))
	}
}

func TestLoginRefusesTenantKeysAndBadTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, func(_ *replica.Config, cfg *web.Config) { cfg.LoginFailuresPerMinute = 100 })
	tenantKey := b.tenant(t, "acme", limits(1000, "1"))
	revoked, revokedSecret, err := credential.AdminTokenCreate(ctx, b.pool, "former")
	if err != nil {
		t.Fatal(err)
	}
	if err := credential.AdminTokenRevoke(ctx, b.pool, revoked.ID); err != nil {
		t.Fatal(err)
	}
	// Right shape and id, wrong secret.
	wrongSecret := b.adminSecret[:len(b.adminSecret)-4] + "aaaa"
	if wrongSecret == b.adminSecret {
		wrongSecret = b.adminSecret[:len(b.adminSecret)-4] + "bbbb"
	}

	for name, token := range map[string]string{
		"tenant key":   tenantKey,
		"garbage":      "tga_not-a-token",
		"empty":        "",
		"wrong secret": wrongSecret,
		"revoked":      revokedSecret,
	} {
		c := b.client(t, "192.0.2.2")
		rec := c.login(token)
		if rec.Code != http.StatusUnauthorized || c.session != nil {
			t.Errorf("%s: %d, session %v; want 401 and no session", name, rec.Code, c.session != nil)
		}
		if name == "tenant key" && !strings.Contains(rec.Body.String(), "tenant API key") {
			t.Errorf("tenant key: the page does not say why: %s", rec.Body.String())
		}
	}
	if n := b.count(t, `SELECT count(*) FROM admin_sessions`); n != 0 {
		t.Errorf("%d sessions exist after failed logins", n)
	}
	if logs := b.logs.String(); tenantKeyPattern.MatchString(logs) || adminTokenPattern.MatchString(logs) || !strings.Contains(logs, `"path":"/login"`) {
		t.Errorf("the logs hold a presented credential (or captured nothing): %s", logs)
	}

	c := b.client(t, "192.0.2.2")
	c.mustLogin()
	if rec := c.get("/"); rec.Code != http.StatusOK {
		t.Fatalf("after login GET /: %d", rec.Code)
	}
}

func TestRevokingTheTokenEndsItsSessions(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.client(t, "192.0.2.3")
	c.mustLogin()
	other := b.client(t, "192.0.2.4")
	other.mustLogin()
	if rec := c.get("/"); rec.Code != http.StatusOK {
		t.Fatalf("GET / while logged in: %d", rec.Code)
	}
	if err := credential.AdminTokenRevoke(ctx, b.pool, b.admin.ID); err != nil {
		t.Fatal(err)
	}
	for _, cl := range []*client{c, other} {
		if rec := cl.get("/"); rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/login" {
			t.Errorf("GET / after revocation: %d %q, want 303 to /login", rec.Code, rec.Header().Get("Location"))
		}
		if rec := cl.get("/ui/overview.json"); rec.Code != http.StatusUnauthorized {
			t.Errorf("live JSON after revocation: %d", rec.Code)
		}
	}
	if rec := b.client(t, "192.0.2.5").login(b.adminSecret); rec.Code != http.StatusUnauthorized {
		t.Errorf("login with the revoked token: %d", rec.Code)
	}
}

func TestFailedLoginsAreRateLimited(t *testing.T) {
	t.Parallel()
	b := setup(t, func(_ *replica.Config, cfg *web.Config) { cfg.LoginFailuresPerMinute = 3 })
	c := b.client(t, "192.0.2.6")
	for i := range 3 {
		if rec := c.login("tga_wrong"); rec.Code != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d, want 401", i+1, rec.Code)
		}
	}
	// The allowance is spent: even the right token is not looked at.
	rec := c.login(b.adminSecret)
	if rec.Code != http.StatusTooManyRequests || c.session != nil {
		t.Fatalf("after 3 failures: %d (session %v), want 429 and no session", rec.Code, c.session != nil)
	}
	if rec.Header().Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	if n := b.count(t, `SELECT count(*) FROM admin_sessions`); n != 0 {
		t.Errorf("a session was created while rate limited")
	}
	// Another address still logs in, and a success spends nothing.
	d := b.client(t, "192.0.2.7")
	for range 5 {
		d.mustLogin()
	}
}

func TestCSRFIsRequiredAndStaleTokensAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.tenant(t, "acme", limits(1000, "1"))
	c := b.client(t, "192.0.2.8")
	c.mustLogin()
	adjust := func(csrf string) *httptest.ResponseRecorder {
		form := url.Values{"tokens": {"500"}, "reason": {"goodwill"}}
		if csrf != "" {
			form.Set("csrf", csrf)
		}
		return c.post("/tenants/acme/adjust", form)
	}
	adjustRows := func() int {
		return b.count(t, `SELECT count(*) FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'adjust'`)
	}

	stale := c.csrf("/tenants/acme")
	for name, token := range map[string]string{"missing": "", "wrong": stale + "x"} {
		if rec := adjust(token); rec.Code != http.StatusForbidden || !strings.Contains(rec.Header().Get("Content-Type"), "text/html") {
			t.Errorf("adjust with a %s CSRF token: %d %s, want a 403 page", name, rec.Code, rec.Header().Get("Content-Type"))
		}
	}
	rec := c.post("/tenants", url.Values{"id": {"sneaky"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1"}})
	if rec.Code != http.StatusForbidden {
		t.Errorf("create tenant without CSRF: %d", rec.Code)
	}
	// The CSRF token in the query string does not count.
	rec = c.do(http.MethodPost, "/tenants/acme/adjust?csrf="+url.QueryEscape(stale), url.Values{"tokens": {"5"}, "reason": {"q"}})
	if rec.Code != http.StatusForbidden {
		t.Errorf("CSRF token in the query: %d, want 403", rec.Code)
	}
	// Logout needs it too.
	if rec := c.post("/logout", url.Values{}); rec.Code != http.StatusForbidden {
		t.Errorf("logout without CSRF: %d", rec.Code)
	}

	// Log out and in again: the old page's token is stale.
	if rec := c.post("/logout", url.Values{"csrf": {stale}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("logout: %d", rec.Code)
	}
	if rec := c.get("/"); rec.Code != http.StatusSeeOther {
		t.Fatalf("GET / after logout: %d, want a redirect to the login", rec.Code)
	}
	c.mustLogin()
	if rec := adjust(stale); rec.Code != http.StatusForbidden {
		t.Errorf("adjust with the CSRF token of the ended session: %d, want 403", rec.Code)
	}
	if n := adjustRows(); n != 0 {
		t.Fatalf("%d adjust entries after refused posts", n)
	}
	if n := b.count(t, `SELECT count(*) FROM tenants WHERE id = 'sneaky'`); n != 0 {
		t.Fatalf("a tenant was created by a refused post")
	}

	// The current token works, which shows the refusals were the CSRF check.
	if rec := adjust(c.csrf("/tenants/acme")); rec.Code != http.StatusSeeOther {
		t.Fatalf("adjust with the current CSRF token: %d %s", rec.Code, rec.Body.String())
	}
	if n := adjustRows(); n != 1 {
		t.Fatalf("%d adjust entries, want 1", n)
	}
}

func TestCrossOriginPostsAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.client(t, "192.0.2.9")
	rec := c.do(http.MethodPost, "/login", url.Values{"token": {b.adminSecret}}, "Sec-Fetch-Site", "cross-site")
	if rec.Code != http.StatusForbidden || len(rec.Result().Cookies()) != 0 {
		t.Errorf("cross-site login: %d, want 403 and no cookie", rec.Code)
	}
	rec = c.do(http.MethodPost, "/login", url.Values{"token": {b.adminSecret}}, "Origin", "https://evil.example")
	if rec.Code != http.StatusForbidden {
		t.Errorf("login from another origin: %d, want 403", rec.Code)
	}
}

func TestSecurityHeadersAndCookieFlags(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.client(t, "192.0.2.10")

	check := func(name string, h http.Header, page bool) {
		t.Helper()
		if got := h.Get("Content-Security-Policy"); got != wantCSP {
			t.Errorf("%s: CSP %q", name, got)
		}
		if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Referrer-Policy") != "same-origin" {
			t.Errorf("%s: nosniff %q, referrer %q", name, h.Get("X-Content-Type-Options"), h.Get("Referrer-Policy"))
		}
		if page && h.Get("Cache-Control") != "no-store" {
			t.Errorf("%s: Cache-Control %q", name, h.Get("Cache-Control"))
		}
	}
	rec := c.get("/login")
	check("login page", rec.Header(), true)

	rec = c.login(b.adminSecret)
	check("login answer", rec.Header(), true)
	ck := c.session
	if ck == nil || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || ck.Secure {
		t.Fatalf("cookie over plain HTTP: %+v", ck)
	}
	check("overview", c.get("/").Header(), true)
	check("live JSON", c.get("/ui/overview.json").Header(), true)

	// Over TLS the cookie is Secure.
	req := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(url.Values{"token": {b.adminSecret}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.RemoteAddr = "192.0.2.11:443"
	req.TLS = &tls.ConnectionState{}
	tlsRec := httptest.NewRecorder()
	b.srv.ServeHTTP(tlsRec, req)
	var secure *http.Cookie
	for _, k := range tlsRec.Result().Cookies() {
		if k.Name == "tokengate_session" {
			secure = k
		}
	}
	if tlsRec.Code != http.StatusSeeOther || secure == nil || !secure.Secure || !secure.HttpOnly || secure.SameSite != http.SameSiteStrictMode {
		t.Fatalf("cookie over TLS: %d %+v", tlsRec.Code, secure)
	}

	// Static files are versioned and carry the same policy.
	page := c.get("/").Body.String()
	css := regexp.MustCompile(`href="(/static/app\.css\?v=[0-9a-f]+)"`).FindStringSubmatch(page)
	if css == nil {
		t.Fatal("no versioned stylesheet link")
	}
	rec = c.get(css[1])
	check("stylesheet", rec.Header(), false)
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/css") {
		t.Errorf("stylesheet: %d %s", rec.Code, rec.Header().Get("Content-Type"))
	}
	// Nothing inline: one script, from a file, and no style attributes.
	anonymous := b.client(t, "192.0.2.19")
	for _, path := range []string{"/", "/models", "/ledger", "/login"} {
		cl := c
		if path == "/login" {
			cl = anonymous
		}
		body := cl.get(path).Body.String()
		if scripts := regexp.MustCompile(`<script[^>]*>`).FindAllString(body, -1); len(scripts) != 1 || !strings.Contains(scripts[0], `src="/static/app.js?v=`) {
			t.Errorf("%s: scripts %q", path, scripts)
		}
		if strings.Contains(body, "style=") || strings.Contains(body, "<style") || regexp.MustCompile(`\son[a-z]+=`).MatchString(body) {
			t.Errorf("%s: inline style or event handler", path)
		}
	}
}

func TestTemplatesEscapeUserText(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	const evil = `<script>alert(1)</script>`
	const escaped = `&lt;script&gt;alert(1)&lt;/script&gt;`
	_, secret, err := credential.AdminTokenCreate(ctx, b.pool, evil)
	if err != nil {
		t.Fatal(err)
	}
	b.tenant(t, "acme", limits(1000, "1"))
	c := b.client(t, "192.0.2.12")
	if rec := c.login(secret); rec.Code != http.StatusSeeOther {
		t.Fatalf("login: %d", rec.Code)
	}
	rec := c.post("/tenants/acme/adjust", url.Values{"csrf": {c.csrf("/")}, "tokens": {"-5"}, "reason": {evil}})
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("adjust: %d %s", rec.Code, rec.Body.String())
	}
	for _, path := range []string{"/", "/tenants/acme", "/ledger", "/ledger?reason=x&actor=" + url.QueryEscape(evil)} {
		body := c.get(path).Body.String()
		if strings.Contains(body, evil) {
			t.Errorf("%s contains the raw tag", path)
		}
		if !strings.Contains(body, escaped) {
			t.Errorf("%s does not show the escaped text", path)
		}
	}
	// A refused form echoes what was typed, escaped.
	rec = c.post("/tenants", url.Values{"csrf": {c.csrf("/")}, "id": {`"><img src=x>`}, "tokens_capacity": {"1"}, "tokens_per_second": {"1"}})
	if rec.Code != http.StatusUnprocessableEntity || strings.Contains(rec.Body.String(), `"><img src=x>`) ||
		!strings.Contains(rec.Body.String(), `&#34;&gt;&lt;img src=x&gt;`) {
		t.Errorf("refused tenant form: %d, raw input echoed or missing", rec.Code)
	}
}

func TestKeySecretIsShownOnceAndNeverLogged(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.tenant(t, "acme", limits(100000, "100"))
	c := b.client(t, "192.0.2.13")
	c.mustLogin()

	rec := c.post("/tenants/acme/keys", url.Values{"csrf": {c.csrf("/tenants/acme")}})
	if rec.Code != http.StatusOK {
		t.Fatalf("create key: %d %s", rec.Code, rec.Body.String())
	}
	secrets := tenantKeyPattern.FindAllString(rec.Body.String(), -1)
	if len(secrets) != 1 {
		t.Fatalf("the creation page shows %d secrets, want exactly 1", len(secrets))
	}
	secret := secrets[0]
	if !strings.Contains(rec.Body.String(), `data-replace-url="/tenants/acme"`) {
		t.Error("the creation page does not swap its address for the tenant page")
	}
	if rec.Header().Get("Cache-Control") != "no-store" {
		t.Error("the creation page may be cached")
	}
	// The key works.
	if adm := b.admit(t, secret, 10); adm.Code != http.StatusCreated {
		t.Fatalf("admission with the new key: %d %s", adm.Code, adm.Body.String())
	}

	later := c.get("/tenants/acme").Body.String()
	if strings.Contains(later, secret) || strings.Contains(later, secret[len(secret)-52:]) {
		t.Fatal("the tenant page shows the secret again")
	}
	if !strings.Contains(later, secret[:16]) {
		t.Error("the tenant page does not list the key by its prefix")
	}
	logs := b.logs.String()
	if strings.Contains(logs, secret[len(secret)-52:]) || tenantKeyPattern.MatchString(logs) {
		t.Fatal("a tenant key secret reached the logs")
	}
	if strings.Contains(logs, b.adminSecret) || adminTokenPattern.MatchString(logs) {
		t.Fatal("an admin token reached the logs")
	}
	if !strings.Contains(logs, `"path":"/tenants/acme/keys"`) {
		t.Fatalf("the log buffer did not capture the requests, so it proves nothing: %s", logs)
	}

	// Revoke it through the page's form.
	keyID := secret[3:15]
	rec = c.post("/tenants/acme/keys/"+keyID+"/revoke", url.Values{"csrf": {c.csrf("/tenants/acme")}})
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("revoke: %d", rec.Code)
	}
	if adm := b.admit(t, secret, 10); adm.Code != http.StatusUnauthorized {
		t.Fatalf("admission with the revoked key: %d", adm.Code)
	}
	if rec := c.post("/tenants/acme/keys/"+keyID+"/revoke", url.Values{"csrf": {c.csrf("/tenants/acme")}}); rec.Code != http.StatusNotFound {
		t.Errorf("revoking twice: %d, want a 404 page", rec.Code)
	}
}

func TestFormsNameTheBadField(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.tenant(t, "acme", limits(1000, "1"))
	c := b.client(t, "192.0.2.14")
	c.mustLogin()
	csrf := c.csrf("/")

	for _, tc := range []struct {
		path string
		form url.Values
		want string
	}{
		{"/tenants", url.Values{"id": {"Bad Id"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1"}}, "id: must be 1-63"},
		{"/tenants", url.Values{"id": {"acme"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1"}}, "id: a tenant with this id already exists"},
		{"/tenants", url.Values{"id": {"n1"}, "tokens_capacity": {"lots"}, "tokens_per_second": {"1"}}, "tokens_capacity: must be a whole number"},
		{"/tenants", url.Values{"id": {"n2"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1.1234567"}}, "tokens_per_second: must be a decimal"},
		{"/tenants", url.Values{"id": {"n3"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1"}, "requests_capacity": {"5"}}, "requests_per_second: requests_capacity and requests_per_second are set together"},
		{"/tenants", url.Values{"id": {"n4"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1"}, "period_budget": {"5"}}, "period: period_budget and period are set together"},
		{"/tenants/acme/limits", url.Values{"tokens_capacity": {"0"}, "tokens_per_second": {"1"}}, "tokens_capacity: must be between 1"},
		{"/tenants/acme/limits", url.Values{"tokens_capacity": {"10"}, "tokens_per_second": {"1"}, "reservation_ttl": {"soon"}}, "reservation_ttl: must be a duration"},
		{"/tenants/acme/adjust", url.Values{"tokens": {"0"}, "reason": {"x"}}, "tokens: must not be 0"},
		{"/tenants/acme/adjust", url.Values{"tokens": {"10"}}, "reason: is required"},
		{"/models", url.Values{"name": {"m"}, "encoding": {"o200k_base"}, "input_weight": {"0"}, "output_weight": {"1"},
			"default_output_tokens": {"10"}, "context_window": {"100"}, "part_tokens": {"1"}}, "input_weight: must be between"},
		{"/models", url.Values{"name": {"m"}, "encoding": {"latin1"}, "input_weight": {"1"}, "output_weight": {"1"},
			"default_output_tokens": {"10"}, "context_window": {"100"}, "part_tokens": {"1"}}, "encoding: unknown encoding"},
		{"/models", url.Values{"name": {"m"}, "encoding": {"o200k_base"}, "input_weight": {"1"}, "output_weight": {"1"}, "cached_input_weight": {"cheap"},
			"default_output_tokens": {"10"}, "context_window": {"100"}, "part_tokens": {"1"}}, "cached_input_weight: must be a decimal"},
	} {
		tc.form.Set("csrf", csrf)
		rec := c.post(tc.path, tc.form)
		if rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("POST %s %v: %d, want 422 naming %q", tc.path, tc.form, rec.Code, tc.want)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM tenants`); n != 1 {
		t.Errorf("%d tenants after refused forms, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM ledger_entries WHERE kind IN ('adjust', 'limits')`); n != 0 {
		t.Errorf("%d entries after refused forms", n)
	}
	for _, path := range []string{"/tenants/acme/limits", "/tenants/acme/keys", "/tenants/acme/keys/abc/revoke"} {
		if rec := c.get(path); rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/tenants/acme" {
			t.Errorf("GET %s (a form's address): %d %q, want a redirect to the tenant page", path, rec.Code, rec.Header().Get("Location"))
		}
	}
	if rec := c.get("/tenants/nope"); rec.Code != http.StatusNotFound || !strings.Contains(rec.Header().Get("Content-Type"), "text/html") {
		t.Errorf("unknown tenant: %d %s, want a 404 page", rec.Code, rec.Header().Get("Content-Type"))
	}
	if rec := c.get("/ledger?from=yesterday"); rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "from: must be a date") {
		t.Errorf("bad ledger filter: %d", rec.Code)
	}
}

func TestTenantForms(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.client(t, "192.0.2.15")
	c.mustLogin()
	csrf := c.csrf("/")

	rec := c.post("/tenants", url.Values{"csrf": {csrf}, "id": {"acme"}, "tokens_capacity": {"200,000"}, "tokens_per_second": {"2.5"},
		"requests_capacity": {"600"}, "requests_per_second": {"10"}, "max_concurrent": {"64"}, "period_budget": {"5000000"}, "period": {"month"}})
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/tenants/acme?done=created" {
		t.Fatalf("create: %d %q %s", rec.Code, rec.Header().Get("Location"), rec.Body.String())
	}
	s, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if l := s.Limits; l.TokensCapacity != 200000 || l.TokensRateMicro != 2_500_000 || l.RequestsCapacity != 600 ||
		l.RequestsRateMicro != 10_000_000 || l.MaxConcurrent != 64 || l.PeriodBudget != 5000000 || l.Period != "month" {
		t.Fatalf("created limits: %+v", l)
	}

	rec = c.post("/tenants/acme/limits", url.Values{"csrf": {csrf}, "tokens_capacity": {"1000"}, "tokens_per_second": {"0.5"},
		"max_concurrent": {"2"}, "reservation_ttl": {"2m"}, "max_wait": {"5s"}})
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("update limits: %d %s", rec.Code, rec.Body.String())
	}
	s, _ = b.store.TenantSnapshot(ctx, "acme")
	if l := s.Limits; l.TokensCapacity != 1000 || l.TokensRateMicro != 500_000 || l.RequestsCapacity != 0 || l.MaxConcurrent != 2 ||
		l.PeriodBudget != 0 || l.ReservationTTL.String() != "2m0s" || l.MaxWait.String() != "5s" {
		t.Fatalf("updated limits: %+v", l)
	}
	page := c.get("/tenants/acme").Body.String()
	for _, want := range []string{`name="tokens_per_second" value="0.5"`, `name="reservation_ttl" value="2m"`, `name="max_wait" value="5s"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the limits form does not show %s", want)
		}
	}

	if rec := c.post("/tenants/acme/disable", url.Values{"csrf": {csrf}, "reason": {"unpaid"}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("disable: %d", rec.Code)
	}
	if s, _ := b.store.TenantSnapshot(ctx, "acme"); !s.Disabled {
		t.Fatal("not disabled")
	}
	if rec := c.post("/tenants/acme/enable", url.Values{"csrf": {csrf}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("enable: %d", rec.Code)
	}
	if rec := c.post("/tenants/acme/adjust", url.Values{"csrf": {csrf}, "tokens": {"-250"}, "reason": {"refund clawback"}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("adjust: %d", rec.Code)
	}
	var actors []string
	rows, err := b.pool.Query(ctx, `SELECT kind || ':' || actor FROM ledger_entries WHERE tenant_id = 'acme' ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		actors = append(actors, s)
	}
	want := "tenant:admin:oncall limits:admin:oncall tenant:admin:oncall tenant:admin:oncall adjust:admin:oncall"
	if got := strings.Join(actors, " "); got != want {
		t.Errorf("ledger kinds and actors: %q, want %q", got, want)
	}
}

func TestModelsSaveExactWeights(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.client(t, "192.0.2.16")
	c.mustLogin()
	rec := c.post("/models", url.Values{"csrf": {c.csrf("/models")}, "name": {"acme-llm"}, "encoding": {"cl100k_base"},
		"input_weight": {"0.25"}, "output_weight": {"4"}, "default_output_tokens": {"2048"}, "context_window": {"32768"}, "part_tokens": {"500"}})
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("save model: %d %s", rec.Code, rec.Body.String())
	}
	var in, out int64
	if err := b.pool.QueryRow(ctx, `SELECT input_weight_micro, output_weight_micro FROM models WHERE name = 'acme-llm'`).Scan(&in, &out); err != nil {
		t.Fatal(err)
	}
	if in != 250_000 || out != 4_000_000 {
		t.Fatalf("stored weights %d, %d; want 250000, 4000000", in, out)
	}
	m, known := b.est.Table().Lookup("acme-llm")
	if !known || m.InputWeightMicro != 250_000 {
		t.Fatalf("this replica's table does not have the model at once: %+v %v", m, known)
	}
	// Override a seeded one.
	rec = c.post("/models", url.Values{"csrf": {c.csrf("/models")}, "name": {"gpt-4o"}, "encoding": {"o200k_base"},
		"input_weight": {"2.5"}, "output_weight": {"10"}, "cached_input_weight": {"1.25"}, "default_output_tokens": {"16384"}, "context_window": {"128000"}, "part_tokens": {"765"}})
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("override: %d", rec.Code)
	}
	page := c.get("/models").Body.String()
	for _, want := range []string{
		`<tr data-model="acme-llm" class="origin-added">`,
		`<tr data-model="gpt-4o" class="origin-overridden">`,
		`<tr data-model="gpt-4.1" class="origin-seeded">`,
		`<td class="num">0.25</td>`,
		`<td class="num">1.25</td>`,           // gpt-4o's cached input weight
		`<span class="muted">as input</span>`, // acme-llm has none
	} {
		if !strings.Contains(page, want) {
			t.Errorf("models page lacks %s", want)
		}
	}
	edit := c.get("/models?edit=gpt-4o").Body.String()
	if !strings.Contains(edit, `name="input_weight" value="2.5"`) || !strings.Contains(edit, `name="cached_input_weight" value="1.25"`) {
		t.Error("the edit form is not filled from the model")
	}
	if m, _ := b.est.Table().Lookup("gpt-4o"); m.CachedInputWeightMicro != 1_250_000 {
		t.Errorf("cached input weight %d, want 1250000", m.CachedInputWeightMicro)
	}
	// A Claude model's cache write weights: shown, edited, stored.
	rec = c.post("/models", url.Values{"csrf": {c.csrf("/models")}, "name": {"claude-sonnet-4-5"}, "encoding": {"o200k_base"},
		"input_weight": {"3"}, "output_weight": {"15"}, "cached_input_weight": {"0.3"}, "cache_write_weight": {"3.75"}, "cache_write_1h_weight": {"6"},
		"default_output_tokens": {"64000"}, "context_window": {"200000"}, "part_tokens": {"1600"}})
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("cache write weights: %d", rec.Code)
	}
	if !strings.Contains(c.get("/models").Body.String(), `<td class="num">3.75 <span class="muted">1 h: 6</span></td>`) {
		t.Error("the models page does not show the cache write weights")
	}
	edit = c.get("/models?edit=claude-sonnet-4-5").Body.String()
	if !strings.Contains(edit, `name="cache_write_weight" value="3.75"`) || !strings.Contains(edit, `name="cache_write_1h_weight" value="6"`) {
		t.Error("the edit form is not filled with the cache write weights")
	}
	var w5, w1 int64
	if err := b.pool.QueryRow(ctx, `SELECT cache_write_weight_micro, cache_write_1h_weight_micro FROM models WHERE name = 'claude-sonnet-4-5'`).Scan(&w5, &w1); err != nil {
		t.Fatal(err)
	}
	if m, _ := b.est.Table().Lookup("claude-sonnet-4-5-20250929"); w5 != 3_750_000 || w1 != 6_000_000 || m.CacheWriteWeightMicro != 3_750_000 || m.CacheWrite1hWeightMicro != 6_000_000 {
		t.Errorf("stored %d, %d; table %+v", w5, w1, m)
	}
}

func TestLedgerPagingAndCSV(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.tenant(t, "acme", limits(1000, "1"))
	b.tenant(t, "other", limits(1000, "1"))
	for i := range 60 {
		if _, err := b.store.Adjust(ctx, adjustParams("acme", int64(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	c := b.client(t, "192.0.2.17")
	c.mustLogin()

	seqs := map[string]bool{}
	rowPattern := regexp.MustCompile(`<a href="/tenants/(\w+)">\w+</a></td><td class="num">(\d+)</td>`)
	next := "/ledger?tenant=acme"
	pages := 0
	for next != "" {
		rec := c.get(next)
		if rec.Code != http.StatusOK {
			t.Fatalf("GET %s: %d", next, rec.Code)
		}
		body := rec.Body.String()
		for _, m := range rowPattern.FindAllStringSubmatch(body, -1) {
			if m[1] != "acme" {
				t.Fatalf("the tenant filter let %s through", m[1])
			}
			if seqs[m[2]] {
				t.Fatalf("seq %s on two pages", m[2])
			}
			seqs[m[2]] = true
		}
		next = ""
		if m := regexp.MustCompile(`href="([^"]+)" id="next-page"`).FindStringSubmatch(body); m != nil {
			next = strings.ReplaceAll(m[1], "&amp;", "&")
		}
		pages++
	}
	if pages != 2 || len(seqs) != 61 {
		t.Fatalf("%d pages, %d distinct entries; want 2 pages of the 61 entries", pages, len(seqs))
	}

	rec := c.get("/ledger.csv?tenant=acme&kind=adjust")
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Disposition"), "attachment;") ||
		!strings.HasPrefix(rec.Header().Get("Content-Type"), "text/csv") {
		t.Fatalf("CSV: %d %q %q", rec.Code, rec.Header().Get("Content-Disposition"), rec.Header().Get("Content-Type"))
	}
	lines := strings.Split(strings.TrimSpace(rec.Body.String()), "\n")
	if len(lines) != 61 || !strings.HasPrefix(lines[0], "tenant_id,seq,kind,created_at,admission_id") {
		t.Fatalf("CSV has %d lines, header %q", len(lines), lines[0])
	}
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, "acme,") || !strings.Contains(l, ",adjust,") {
			t.Fatalf("CSV row outside the filter: %s", l)
		}
	}
	if rec := c.get("/ledger.csv?kind=bogus"); rec.Code != http.StatusBadRequest {
		t.Errorf("CSV with a bad filter: %d", rec.Code)
	}
}

func TestLiveJSONShowsThrottledTenantsFirst(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.tenant(t, "alpha", limits(100000, "100"))
	l := limits(100000, "100")
	l.MaxConcurrent = 1
	key := b.tenant(t, "zeta", l)
	c := b.client(t, "192.0.2.18")
	c.mustLogin()

	if rec := b.admit(t, key, 50); rec.Code != http.StatusCreated {
		t.Fatalf("admit: %d %s", rec.Code, rec.Body.String())
	}
	if rec := b.admit(t, key, 50); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("second admission: %d, want 429 by the concurrency limit", rec.Code)
	}
	if err := b.rejections.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var live struct {
		Tenants []struct {
			ID     string            `json:"id"`
			Status string            `json:"status"`
			Fields map[string]string `json:"fields"`
			Gauges map[string]struct {
				Pct   string `json:"pct"`
				Level string `json:"level"`
			} `json:"gauges"`
		} `json:"tenants"`
	}
	rec := c.get("/ui/overview.json")
	if rec.Code != http.StatusOK {
		t.Fatalf("live JSON: %d", rec.Code)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &live); err != nil {
		t.Fatal(err)
	}
	if len(live.Tenants) != 2 || live.Tenants[0].ID != "zeta" {
		t.Fatalf("order %+v: the throttled tenant must come first", live.Tenants)
	}
	z := live.Tenants[0]
	// A minute may turn between the requests and the query: add "prev".
	total := func(f map[string]string, k string) int {
		a, _ := strconv.Atoi(f[k])
		b, _ := strconv.Atoi(f[k+"_prev"])
		return a + b
	}
	if z.Status != "throttled" || total(z.Fields, "admitted") != 1 || total(z.Fields, "rejected") != 1 || z.Fields["why"] != "concurrency" ||
		z.Fields["open"] != "1 / 1" || z.Gauges["open"].Level != "bad" {
		t.Fatalf("zeta: %+v", z)
	}
	if a := live.Tenants[1]; a.Status != "ok" || total(a.Fields, "admitted") != 0 || a.Fields["requests"] != "—" {
		t.Fatalf("alpha: %+v", a)
	}

	// One tenant's page polls just that tenant.
	rec = c.get("/ui/overview.json?tenant=alpha")
	if err := json.Unmarshal(rec.Body.Bytes(), &live); err != nil || len(live.Tenants) != 1 || live.Tenants[0].ID != "alpha" {
		t.Fatalf("one tenant: %d %s", rec.Code, rec.Body.String())
	}
	if rec := c.get("/ui/overview.json?tenant=nope"); rec.Code != http.StatusNotFound {
		t.Errorf("unknown tenant: %d", rec.Code)
	}

	// The page itself shows the same, throttled row first.
	page := c.get("/").Body.String()
	if i, j := strings.Index(page, `data-tenant="zeta"`), strings.Index(page, `data-tenant="alpha"`); i < 0 || j < 0 || i > j {
		t.Error("the overview does not list the throttled tenant first")
	}
	if !strings.Contains(page, `class="tenant status-throttled"`) {
		t.Error("the throttled row is not marked")
	}
}
