package web_test

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tokengate/tokengate/estimator"
)

// TestBrowserPrices drives, in Chromium, the prices page: the imported
// table in effect, a refused form (each bad field named, nothing stored),
// then a price added now and one for later; the page lists the one in
// effect, and each row records the admin's name.
func TestBrowserPrices(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	base := serve(t, b)
	br := startBrowser(t, base)
	f, err := estimator.DefaultPriceFile()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := estimator.PriceImport(ctx, b.pool, f, "cli"); err != nil {
		t.Fatal(err)
	}
	ps, _ := f.Prices()
	br.login(b.adminSecret)

	br.navigate("/prices")
	br.do("wait for the table", chromedp.WaitVisible(chromedp.CSS("#prices")))
	row := func(model string) []string {
		t.Helper()
		return br.texts(`Array.from(document.querySelectorAll('#prices tr[data-model="` + model + `"][data-tier="default"] td[data-price]')).map(function (td) { return td.textContent.trim(); })`)
	}
	if n := eval[int](br, `document.querySelectorAll('#prices tbody tr[data-model]').length`); n != len(ps) {
		t.Fatalf("%d rows, want %d", n, len(ps))
	}
	if got := row("claude-sonnet-4-5"); !slices.Equal(got, []string{"3", "15", "0.3", "3.75", "6", "as output", "none"}) {
		t.Errorf("claude-sonnet-4-5: %q", got)
	}
	if got := row("gemini-2.5-pro"); !slices.Equal(got, []string{"1.25", "10", "as input", "as input", "as 5 min", "as output", "above 200,000: 2.5 / 15"}) {
		t.Errorf("gemini-2.5-pro: %q", got)
	}
	br.noViolations("/prices")

	// A refused form: every bad field is named, and nothing is stored.
	before := b.count(t, `SELECT count(*) FROM model_prices`)
	br.do("add a bad price",
		chromedp.SetValue(chromedp.CSS("#p-model"), "gpt-4o"),
		chromedp.SetValue(chromedp.CSS("#p-input"), "2.5000001"),
		chromedp.SetValue(chromedp.CSS("#p-output"), "ten"),
		chromedp.SetValue(chromedp.CSS("#p-effective_from"), "2020-01-01T00:00:00Z"),
		submit(`#price button[type="submit"]`))
	decimal := "must be a decimal price per million tokens with at most 6 decimal places, such as 1.25"
	if got := br.formErrors("#price"); len(got) != 4 || got[0] != "input: "+decimal || got[2] != "input: "+decimal ||
		got[1] != "output: must be a decimal price per million tokens between 0 and 1000000" {
		t.Errorf("refused form: %q", got)
	}
	if v := eval[string](br, `document.querySelector('#p-model').value`); v != "gpt-4o" {
		t.Errorf("the refused form lost the model: %q", v)
	}
	br.do("add a past price",
		chromedp.SetValue(chromedp.CSS("#p-input"), "2"),
		chromedp.SetValue(chromedp.CSS("#p-output"), "8"),
		submit(`#price button[type="submit"]`))
	if got := br.formErrors("#price"); len(got) != 2 || got[1] != "effective_from: must not be in the past: a price change never rewrites history" {
		t.Errorf("a past price: %q", got)
	}
	if n := b.count(t, `SELECT count(*) FROM model_prices`); n != before {
		t.Fatalf("%d rows after refused forms, want %d", n, before)
	}

	// A price now, and one for tomorrow: the page shows the one in effect.
	eval[bool](br, `(document.querySelector('#p-effective_from').value = '', true)`)
	br.do("add a price now",
		chromedp.SetValue(chromedp.CSS("#p-reasoning_output"), "12"),
		submit(`#price button[type="submit"]`))
	br.flash("Price added.")
	if got := row("gpt-4o"); !slices.Equal(got, []string{"2", "8", "as input", "as input", "as 5 min", "12", "none"}) {
		t.Errorf("gpt-4o after the change: %q", got)
	}
	later := time.Now().Add(24 * time.Hour).UTC().Truncate(time.Second)
	br.do("add a price for tomorrow",
		chromedp.SetValue(chromedp.CSS("#p-model"), "gpt-4o"),
		chromedp.SetValue(chromedp.CSS("#p-input"), "1"),
		chromedp.SetValue(chromedp.CSS("#p-output"), "4"),
		chromedp.SetValue(chromedp.CSS("#p-effective_from"), later.Format(time.RFC3339)),
		submit(`#price button[type="submit"]`))
	br.flash("Price added.")
	if got := row("gpt-4o"); got[0] != "2" {
		t.Errorf("a price for tomorrow shows today: %q", got)
	}
	if n := b.count(t, `SELECT count(*) FROM model_prices WHERE model = 'gpt-4o' AND created_by = 'admin:oncall' AND source = 'dashboard'`); n != 2 {
		t.Fatalf("%d gpt-4o rows by admin:oncall, want 2", n)
	}
	p, err := estimator.PriceAt(ctx, b.pool, "gpt-4o", later)
	if err != nil || p.InputMicro != 1_000_000 || p.OutputMicro != 4_000_000 {
		t.Fatalf("tomorrow's price: %+v %v", p, err)
	}

	// Without the session's CSRF token the form changes nothing.
	c := b.client(t, "192.0.2.60")
	c.mustLogin()
	rec := c.post("/prices", url.Values{"model": {"x"}, "input": {"1"}, "output": {"1"}, "csrf": {"forged"}})
	if rec.Code != http.StatusForbidden || b.count(t, `SELECT count(*) FROM model_prices WHERE model = 'x'`) != 0 {
		t.Fatalf("forged csrf: %d", rec.Code)
	}
	if rec := c.post("/prices", url.Values{"model": {"x"}, "input": {"1"}, "output": {"1"}, "csrf": {c.csrf("/prices")}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("with the csrf token: %d %s", rec.Code, rec.Body)
	}

	// A price for a service tier is a row of its own, listed beside the
	// default tier's; an unknown tier is refused, naming the field.
	if rec := c.post("/prices", url.Values{"model": {"x"}, "service_tier": {"turbo"}, "input": {"1"}, "output": {"1"}, "csrf": {c.csrf("/prices")}}); rec.Code != http.StatusUnprocessableEntity ||
		!strings.Contains(rec.Body.String(), "service_tier: must be one of default, flex, priority, batch") {
		t.Fatalf("an unknown tier: %d %s", rec.Code, rec.Body)
	}
	if rec := c.post("/prices", url.Values{"model": {"x"}, "service_tier": {"flex"}, "input": {"0.5"}, "output": {"1"}, "csrf": {c.csrf("/prices")}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("a flex price: %d %s", rec.Code, rec.Body)
	}
	br.navigate("/prices")
	if got := br.texts(`Array.from(document.querySelectorAll('#prices tr[data-model="x"]')).map(function (tr) { return tr.dataset.tier + ":" + tr.querySelector('td[data-price="input"]').textContent.trim(); })`); !slices.Equal(got, []string{"default:1", "flex:0.5"}) {
		t.Errorf("x's rows: %q", got)
	}
}
