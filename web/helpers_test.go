package web_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/api"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/web"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var ctx = context.Background()

// syncBuffer collects the server's log lines; the server writes from its
// goroutines while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testBundle is one server (API plus dashboard) over its own database, with
// an admin token to log in with.
type testBundle struct {
	pool        *pgxpool.Pool
	store       *account.Store
	est         *estimator.Estimator
	rejections  *account.Rejections
	srv         *api.Server
	rep         *replica.Replica
	logs        *syncBuffer
	admin       credential.AdminToken
	adminSecret string
}

func setup(t *testing.T, configure func(*replica.Config, *web.Config)) *testBundle {
	t.Helper()
	pool := pgtest.New(t, nil)
	b := &testBundle{
		pool:       pool,
		store:      account.NewStore(pool),
		est:        estimator.New(nil),
		rejections: account.NewRejections(pool),
		logs:       &syncBuffer{},
	}
	logger := slog.New(slog.NewJSONHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rc := &replica.Config{DB: pool, Logger: logger, Store: b.store, Estimator: b.est, Rejections: b.rejections}
	cfg := &web.Config{}
	if configure != nil {
		configure(rc, cfg)
	}
	rep, err := replica.New(*rc)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(rep, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close(); rep.Close() })
	b.rep = rep
	dash, err := web.New(rep, cfg)
	if err != nil {
		t.Fatal(err)
	}
	dash.Register(srv.Echo())
	b.srv = srv
	b.admin, b.adminSecret, err = credential.AdminTokenCreate(ctx, pool, "oncall")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tenant creates a tenant directly and returns a key for it.
func (b *testBundle) tenant(t *testing.T, id string, l rule.Limits) string {
	t.Helper()
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: l, Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	_, secret, err := credential.KeyCreate(ctx, b.pool, id)
	if err != nil {
		t.Fatal(err)
	}
	return secret
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// client is a browser stand-in over httptest: it keeps the session cookie
// and comes from one address.
type client struct {
	t       *testing.T
	b       *testBundle
	ip      string
	session *http.Cookie
}

func (b *testBundle) client(t *testing.T, ip string) *client {
	return &client{t: t, b: b, ip: ip}
}

func (c *client) do(method, path string, form url.Values, headers ...string) *httptest.ResponseRecorder {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req := httptest.NewRequest(method, path, body)
	req.RemoteAddr = c.ip + ":40000"
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	if c.session != nil {
		req.AddCookie(&http.Cookie{Name: c.session.Name, Value: c.session.Value})
	}
	rec := httptest.NewRecorder()
	c.b.srv.ServeHTTP(rec, req)
	return rec
}

func (c *client) get(path string) *httptest.ResponseRecorder {
	c.t.Helper()
	return c.do(http.MethodGet, path, nil)
}

func (c *client) post(path string, form url.Values) *httptest.ResponseRecorder {
	c.t.Helper()
	return c.do(http.MethodPost, path, form)
}

// login posts a token to the login form and keeps the session cookie.
func (c *client) login(token string) *httptest.ResponseRecorder {
	c.t.Helper()
	rec := c.post("/login", url.Values{"token": {token}})
	for _, ck := range rec.Result().Cookies() {
		if ck.Name == "tokengate_session" && ck.Value != "" {
			c.session = ck
		}
	}
	return rec
}

func (c *client) mustLogin() {
	c.t.Helper()
	if rec := c.login(c.b.adminSecret); rec.Code != http.StatusSeeOther {
		c.t.Fatalf("login: %d %s", rec.Code, rec.Body.String())
	}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf reads the CSRF token from a page's forms.
func (c *client) csrf(path string) string {
	c.t.Helper()
	rec := c.get(path)
	m := csrfField.FindStringSubmatch(rec.Body.String())
	if rec.Code != http.StatusOK || m == nil {
		c.t.Fatalf("GET %s: %d, no csrf field", path, rec.Code)
	}
	return m[1]
}

// admit sends an admission request with a tenant key through the API.
func (b *testBundle) admit(t *testing.T, key string, maxTokens int) *httptest.ResponseRecorder {
	t.Helper()
	body := fmt.Sprintf(`{"model":"gpt-4o","messages":[{"role":"user","content":"Hello!"}],"max_tokens":%d}`, maxTokens)
	req := httptest.NewRequest(http.MethodPost, "/v1/admissions", strings.NewReader(body))
	req.RemoteAddr = "198.51.100.7:5000"
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, req)
	return rec
}

var (
	tenantKeyPattern  = regexp.MustCompile(`tg_[a-z2-7]{12}_[a-z2-7]{52}`)
	adminTokenPattern = regexp.MustCompile(`tga_[a-z2-7]{12}_[a-z2-7]{52}`)
)

func limits(capacity int64, perSecond string) rule.Limits {
	rate, err := rule.ParseRate(perSecond)
	if err != nil {
		panic(err)
	}
	return rule.Limits{TokensCapacity: capacity, TokensRateMicro: rate}
}

func adjustParams(id string, tokens int64) account.AdjustParams {
	return account.AdjustParams{TenantID: id, Tokens: tokens, Reason: "test credit", Actor: "test"}
}
