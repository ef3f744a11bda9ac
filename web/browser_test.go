package web_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// The browser scenario drives Debian's chromium through the dashboard the
// way an on-call admin would, against a real listener and database, and
// checks what only a browser can: the live updates without a reload, the
// page's CSP holding with our own script and stylesheet, the layout at
// desktop and phone widths.

// chromiumPath finds the browser. CI installs Debian's chromium with apt;
// a machine without it fails here rather than skipping the scenario.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium found (looked for chromium, chromium-browser, google-chrome): " +
		"install Debian's chromium with `apt-get install -y --no-install-recommends chromium` (CI installs it with apt)")
	return ""
}

// serve runs the bundle's server on a loopback port until the test ends.
func serve(t *testing.T, b *testBundle) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.srv.Serve(sctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("the server did not stop")
		}
	})
	return "http://" + ln.Addr().String()
}

// browser is one tab, with the console messages it has written so far.
type browser struct {
	t    *testing.T
	ctx  context.Context
	base string

	mu      sync.Mutex
	console []chromedp.ConsoleMessage
	notify  chan struct{}
}

func startBrowser(t *testing.T, base string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 800),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	tab, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	// The first run starts the browser; it gets no timeout, or the timeout
	// would end the browser with it. Later steps each get their own.
	if err := chromedp.Do(tab); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	br := &browser{t: t, ctx: tab, base: base, notify: make(chan struct{}, 1)}
	messages := chromedp.Console(tab)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			br.mu.Lock()
			br.console = append(br.console, m)
			br.mu.Unlock()
			select {
			case br.notify <- struct{}{}:
			default:
			}
		}
	}()
	// Every document records the CSP violations it sees, for noViolations.
	_, err := chromedp.Call(tab, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{
		Source: `window.__csp = []; document.addEventListener('securitypolicyviolation', function (e) {
			window.__csp.push(e.violatedDirective + ' ' + e.blockedURI); });`,
	})
	if err != nil {
		t.Fatal(err)
	}
	return br
}

func (br *browser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	br.t.Helper()
	ctx, cancel := context.WithTimeout(br.ctx, 15*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		br.t.Fatalf("%s: %v", what, err)
	}
}

func eval[T any](br *browser, expr string, opts ...chromedp.EvaluateOption) T {
	br.t.Helper()
	ctx, cancel := context.WithTimeout(br.ctx, 15*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, opts...))
	if err != nil {
		br.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// texts evaluates an expression that yields strings.
func (br *browser) texts(js string) []string {
	br.t.Helper()
	return eval[[]string](br, js)
}

// flash checks that the page's flash message starts with want.
func (br *browser) flash(want string) {
	br.t.Helper()
	if got := eval[string](br, `(document.querySelector('.flash') || {}).textContent || ''`); !strings.HasPrefix(got, want) {
		br.t.Fatalf("the page says %q, want %q", got, want)
	}
}

// formErrors is a refused form's summary and field errors, in page order.
func (br *browser) formErrors(form string) []string {
	br.t.Helper()
	return br.texts(`Array.from(document.querySelectorAll('` + form + ` .form-errors li, ` + form + ` .field-error')).map(function (e) { return e.textContent; })`)
}

// waitFor polls a JavaScript predicate in the page until it holds.
func (br *browser) waitFor(what, predicate string, timeout time.Duration) {
	br.t.Helper()
	ctx, cancel := context.WithTimeout(br.ctx, timeout+5*time.Second)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](predicate,
		chromedp.WithPollingTimeout(timeout), chromedp.WithPollingInterval(100*time.Millisecond)))
	if err != nil {
		br.t.Fatalf("waiting for %s (%s): %v", what, predicate, err)
	}
}

// submit clicks a form's button and waits for the page it leads to.
func submit(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.WaitEvent(page.LoadEventFired, nil, chromedp.Click(chromedp.CSS(sel)))(ctx, t)
		return err
	})
}

func (br *browser) navigate(path string) {
	br.t.Helper()
	br.do("open "+path, chromedp.Navigate(br.base+path))
}

func (br *browser) path() string {
	br.t.Helper()
	return eval[string](br, `location.pathname + location.search`)
}

// noViolations checks the current document reported no CSP violation.
func (br *browser) noViolations(where string) {
	br.t.Helper()
	if v := eval[[]string](br, `window.__csp || []`); len(v) != 0 {
		br.t.Errorf("%s: CSP violations %q", where, v)
	}
}

// waitConsole waits until a console message satisfies ok.
func (br *browser) waitConsole(ok func(chromedp.ConsoleMessage) bool, timeout time.Duration) bool {
	deadline := time.After(timeout)
	for {
		br.mu.Lock()
		for _, m := range br.console {
			if ok(m) {
				br.mu.Unlock()
				return true
			}
		}
		br.mu.Unlock()
		select {
		case <-br.notify:
		case <-deadline:
			return false
		}
	}
}

func (br *browser) login(secret string) {
	br.t.Helper()
	br.navigate("/")
	if p := br.path(); p != "/login" {
		br.t.Fatalf("logged out, / shows %s, want /login", p)
	}
	br.do("log in",
		chromedp.SetValue(chromedp.CSS("#token"), secret),
		submit(`#login button[type="submit"]`),
		chromedp.WaitVisible(chromedp.CSS("#overview")),
	)
}

// apiCall sends a tenant's request to the API over the real listener.
func apiCall(t *testing.T, base, key, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var v map[string]any
	_ = json.Unmarshal(raw, &v)
	return resp.StatusCode, v
}

func TestBrowserScenario(t *testing.T) {
	t.Parallel()
	start := time.Now()
	b := setup(t, nil)
	base := serve(t, b)
	br := startBrowser(t, base)
	shots := filepath.Join("..", "screenshots")
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}

	// 1. Log in through the form.
	br.login(b.adminSecret)
	if p := br.path(); p != "/" {
		t.Fatalf("after login: %s", p)
	}
	br.noViolations("overview")

	// 2. Create a tenant, then set its limits on its page.
	br.do("create tenant",
		chromedp.SetValue(chromedp.CSS("#new-id"), "acme"),
		chromedp.SetValue(chromedp.CSS("#new-tokens_capacity"), "1000"),
		chromedp.SetValue(chromedp.CSS("#new-tokens_per_second"), "1"),
		submit(`#create-tenant button[type="submit"]`),
		chromedp.WaitVisible(chromedp.CSS(`#tenant[data-tenant="acme"]`)),
	)
	br.do("set limits",
		chromedp.SetValue(chromedp.CSS("#lim-tokens_capacity"), "500"),
		chromedp.SetValue(chromedp.CSS("#lim-tokens_per_second"), "0.5"),
		chromedp.SetValue(chromedp.CSS("#lim-max_concurrent"), "1"),
		submit(`#limits button[type="submit"]`),
	)
	if flash := eval[string](br, `document.querySelector('.flash').textContent`); !strings.Contains(flash, "Limits saved") {
		t.Fatalf("after saving limits the page says %q", flash)
	}
	snap, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if l := snap.Limits; l.TokensCapacity != 500 || l.TokensRateMicro != 500_000 || l.MaxConcurrent != 1 {
		t.Fatalf("limits after the form: %+v", l)
	}
	br.noViolations("tenant page")

	// 3. Create a key: its secret shows once, and a reload does not show it.
	br.do("create key", submit(`#create-key button[type="submit"]`), chromedp.WaitVisible(chromedp.CSS("#new-key-secret")))
	key := strings.TrimSpace(eval[string](br, `document.getElementById('new-key-secret').textContent`))
	if !tenantKeyPattern.MatchString(key) {
		t.Fatalf("the new key reads %q", key)
	}
	if p := br.path(); p != "/tenants/acme" {
		t.Errorf("the key page's address is %s, want the tenant page", p)
	}
	br.do("reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#keys-section")))
	if shown := eval[bool](br, fmt.Sprintf(`document.getElementById('new-key') !== null || document.documentElement.outerHTML.includes(%q)`, key)); shown {
		t.Fatal("the secret is still shown after a reload")
	}
	if n := b.count(t, `SELECT count(*) FROM api_keys WHERE tenant_id = 'acme'`); n != 1 {
		t.Fatalf("%d keys after the reload: the reload resubmitted the form", n)
	}
	if !eval[bool](br, fmt.Sprintf(`document.querySelector('tr[data-key=%q]') !== null`, key[3:15])) {
		t.Error("the key is not listed")
	}

	// 4. The overview follows admissions and rejections without a reload.
	// The counters are per minute of the database's clock, so a count may
	// have moved to "prev" when a minute turns: the checks add the two.
	br.navigate("/")
	row := `document.querySelector('tr[data-tenant="acme"]')`
	br.waitFor("the live script's first answer", `document.getElementById('live-status').textContent.startsWith('live ·')`, 10*time.Second)
	before := eval[string](br, row+`.querySelector('[data-gauge="tokens"] .fill').getAttribute('width')`)
	if got := eval[string](br, row+`.querySelector('[data-field="admitted"]').textContent`); got != "0" || before != "100" {
		t.Fatalf("before any admission: admitted %q, tokens gauge %q", got, before)
	}
	eval[bool](br, `window.__notReloaded = true`)

	code, adm := apiCall(t, base, key, "/v1/admissions",
		`{"model":"gpt-4o","messages":[{"role":"user","content":"Hello!"}],"max_tokens":100}`)
	if code != http.StatusCreated {
		t.Fatalf("admission: %d %v", code, adm)
	}
	admID, _ := adm["id"].(string)
	br.waitFor("the admitted counter and tokens gauge to move",
		`(function (r) { return Number(r.querySelector('[data-field="admitted"]').textContent) + `+
			`Number(r.querySelector('[data-field="admitted_prev"]').textContent) === 1; })(`+row+`) && `+
			row+`.querySelector('[data-gauge="tokens"] .fill').getAttribute('width') !== '100' && `+
			row+`.querySelector('[data-field="open"]').textContent === '1 / 1'`, 10*time.Second)

	code, rej := apiCall(t, base, key, "/v1/admissions",
		`{"model":"gpt-4o","messages":[{"role":"user","content":"Again"}],"max_tokens":100}`)
	if code != http.StatusTooManyRequests {
		t.Fatalf("second admission: %d %v, want 429", code, rej)
	}
	if err := b.rejections.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	br.waitFor("the rejected counter and why",
		`(function (r) { return Number(r.querySelector('[data-field="rejected"]').textContent) + `+
			`Number(r.querySelector('[data-field="rejected_prev"]').textContent) === 1; })(`+row+`) && `+
			row+`.querySelector('[data-field="why"]').textContent === 'concurrency' && `+
			row+`.classList.contains('status-throttled') && `+
			`document.querySelector('[data-summary="throttled"]').textContent === '1'`, 10*time.Second)
	if !eval[bool](br, `window.__notReloaded === true`) {
		t.Fatal("the overview reloaded instead of updating in place")
	}
	br.noViolations("live overview")

	// Settle, for the tenant page's estimate-versus-actual chart.
	if code, st := apiCall(t, base, key, "/v1/admissions/"+admID+"/settle",
		`{"usage":{"prompt_tokens":9,"completion_tokens":12}}`); code != http.StatusOK {
		t.Fatalf("settle: %d %v", code, st)
	}

	// 5. Find the admission in the ledger browser, and export the CSV.
	br.navigate("/ledger")
	br.do("filter the ledger",
		chromedp.SetValue(chromedp.CSS("#f-tenant"), "acme"),
		chromedp.SetValue(chromedp.CSS("#f-admission"), admID),
		submit(`#ledger-filter button[type="submit"]`),
	)
	if n := eval[int](br, fmt.Sprintf(`document.querySelectorAll('tr[data-admission=%q]').length`, admID)); n != 2 {
		t.Fatalf("the filtered ledger shows %d entries of the admission, want its reserve and settle", n)
	}
	if p := br.path(); !strings.Contains(p, "tenant=acme") || !strings.Contains(p, "admission="+admID) {
		t.Errorf("the filter is not in the address: %s", p)
	}
	type download struct {
		Status      int    `json:"status"`
		Disposition string `json:"disposition"`
		Body        string `json:"body"`
	}
	csv := eval[download](br, `fetch(document.getElementById('export-csv').getAttribute('href')).then(function (r) {
		return r.text().then(function (t) { return {status: r.status, disposition: r.headers.get('content-disposition'), body: t}; });
	})`, chromedp.EvalAwaitPromise)
	lines := strings.Split(strings.TrimSpace(csv.Body), "\n")
	if csv.Status != http.StatusOK || !strings.HasPrefix(csv.Disposition, "attachment;") ||
		!strings.HasPrefix(lines[0], "tenant_id,seq,kind,created_at,admission_id,model,estimate,actual") || len(lines) != 3 {
		t.Fatalf("CSV export: %d %q\n%s", csv.Status, csv.Disposition, csv.Body)
	}
	for i, kind := range []string{"settle", "reserve"} {
		if !strings.HasPrefix(lines[i+1], "acme,") || !strings.Contains(lines[i+1], ","+kind+",") || !strings.Contains(lines[i+1], ","+admID+",gpt-4o,") {
			t.Errorf("CSV row %d: %s", i+1, lines[i+1])
		}
	}
	br.noViolations("ledger")

	// 6. Log out; a form rendered before is refused after logging in again.
	br.navigate("/tenants/acme")
	stale := eval[string](br, `document.querySelector('#adjust input[name="csrf"]').value`)
	br.do("log out", submit(`#logout button[type="submit"]`), chromedp.WaitVisible(chromedp.CSS("#login")))
	if p := br.path(); p != "/login?bye=1" {
		t.Errorf("after logout: %s", p)
	}
	br.login(b.adminSecret)
	br.navigate("/tenants/acme")
	br.do("submit a form with the old CSRF token",
		chromedp.SetValue(chromedp.CSS(`#adjust input[name="csrf"]`), stale),
		chromedp.SetValue(chromedp.CSS("#adj-tokens"), "1000"),
		chromedp.SetValue(chromedp.CSS("#adj-reason"), "stale form"),
		submit(`#adjust button[type="submit"]`),
		chromedp.WaitVisible(chromedp.CSS("#error")),
	)
	if h := eval[string](br, `document.querySelector('#error h1').textContent`); !strings.HasPrefix(h, "403") {
		t.Fatalf("stale CSRF token: the page says %q, want 403", h)
	}
	if n := b.count(t, `SELECT count(*) FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'adjust'`); n != 0 {
		t.Fatalf("the stale form changed the ledger: %d adjust entries", n)
	}
	// The same form rendered for this session goes through.
	br.navigate("/tenants/acme")
	br.do("adjust with the current form",
		chromedp.SetValue(chromedp.CSS("#adj-tokens"), "-25"),
		chromedp.SetValue(chromedp.CSS("#adj-reason"), "goodwill reversal"),
		submit(`#adjust button[type="submit"]`),
	)
	if n := b.count(t, `SELECT count(*) FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'adjust' AND actor = 'admin:oncall'`); n != 1 {
		t.Fatalf("%d adjust entries by oncall after the current form, want 1", n)
	}

	// Layout at desktop and phone widths: no sideways scrolling of the
	// page (wide tables scroll inside their wrapper), and screenshots.
	for _, vp := range []struct {
		w, h int64
	}{{1280, 800}, {390, 844}} {
		br.do("viewport", chromedp.EmulateViewport(vp.w, vp.h))
		for _, pg := range []struct{ name, path string }{
			{"overview", "/"}, {"tenant", "/tenants/acme"}, {"ledger", "/ledger"}, {"models", "/models"}, {"prices", "/prices"},
		} {
			br.navigate(pg.path)
			br.do("wait for "+pg.path, chromedp.WaitVisible(chromedp.CSS("main")))
			sizes := eval[[]int](br, `[document.documentElement.scrollWidth, document.body.scrollWidth, window.innerWidth]`)
			if sizes[2] != int(vp.w) || sizes[0] > sizes[2] || sizes[1] > sizes[2] {
				t.Errorf("%s at %d px: scroll widths %d (html), %d (body) for a %d px viewport", pg.path, vp.w, sizes[0], sizes[1], sizes[2])
			}
			br.noViolations(fmt.Sprintf("%s at %d px", pg.path, vp.w))
			ctx, cancel := context.WithTimeout(br.ctx, 15*time.Second)
			png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
			cancel()
			if err != nil {
				t.Fatalf("screenshot: %v", err)
			}
			name := filepath.Join(shots, fmt.Sprintf("%s-%d.png", pg.name, vp.w))
			if err := os.WriteFile(name, png, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	br.navigate("/tenants/acme")
	if n := eval[int](br, `document.querySelectorAll('#cost-chart .pair').length`); n != 1 {
		t.Errorf("the chart shows %d settled admissions, want 1", n)
	}

	// The console: no CSP violation and no exception anywhere. First make
	// sure a violation would be seen: an inline script must be refused and
	// reported.
	injected := eval[bool](br, `(function () { var s = document.createElement('script'); s.textContent = 'window.__inline = 1';
		document.body.appendChild(s); return window.__inline === undefined; })()`)
	if !injected {
		t.Fatal("an inline script ran: the CSP is not enforced")
	}
	isCSP := func(m chromedp.ConsoleMessage) bool { return strings.Contains(m.Text, "Content Security Policy") }
	if !br.waitConsole(isCSP, 10*time.Second) {
		t.Fatal("the console did not report the injected violation, so its silence proves nothing")
	}
	br.mu.Lock()
	messages := append([]chromedp.ConsoleMessage(nil), br.console...)
	br.mu.Unlock()
	violations := 0
	for _, m := range messages {
		switch {
		case isCSP(m):
			violations++
		case m.IsException():
			t.Errorf("console exception: %s", m.Text)
		case m.Type == chromedp.ConsoleError:
			t.Logf("console: %s", m)
		}
	}
	if violations != 1 {
		t.Errorf("%d CSP violations in the console, want only the injected one", violations)
		for _, m := range messages {
			t.Log(m)
		}
	}
	if logs := b.logs.String(); tenantKeyPattern.MatchString(logs) || adminTokenPattern.MatchString(logs) {
		t.Error("a key or admin token reached the server's logs")
	}
	t.Logf("browser scenario took %s", time.Since(start).Round(time.Millisecond))
}
