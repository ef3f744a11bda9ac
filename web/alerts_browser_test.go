package web_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// receiver is a webhook endpoint as an admin's would be: it verifies each
// delivery's signature with the secret the page showed, and answers 200
// (or 503 while failing).
type receiver struct {
	srv *httptest.Server

	mu        sync.Mutex
	secret    string
	failing   bool
	delivered []string // event ids answered 200
	refused   int      // deliveries that answered 503
	forged    []string // deliveries whose signature did not verify
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	rc := &receiver{}
	rc.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if err := alert.Verify(rc.secret, r.Header.Get(alert.HeaderSignature), body, 5*time.Minute, time.Now()); err != nil {
			rc.forged = append(rc.forged, err.Error())
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if rc.failing {
			rc.refused++
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		rc.delivered = append(rc.delivered, r.Header.Get(alert.HeaderEventID))
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) set(secret string, failing bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.secret, rc.failing = secret, failing
}

func (rc *receiver) counts() (delivered []string, refused int, forged []string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.delivered), rc.refused, slices.Clone(rc.forged)
}

// TestBrowserAlerts drives the alerts page in Chromium: an endpoint
// created through its form (a TLS receiver in the test), its secret shown
// once; a refused rule and a period_budget rule at 50 and 100 %; real
// admissions that cross the thresholds; the dispatcher delivering signed
// events, which the receiver verifies with the secret the page showed;
// the delivery log with each attempt; a rotated secret; a failed event
// redelivered; and disabling the endpoint and deleting the rule.
func TestBrowserAlerts(t *testing.T) {
	t.Parallel()
	start := time.Now()
	b, alerts := setupAlerts(t)
	alerts.AllowPrivate = true // the receiver listens on loopback
	base := serve(t, b)
	br := startBrowser(t, base)
	rc := newReceiver(t)
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Actor: "test", Limits: rule.Limits{
		TokensCapacity: 1_000_000, TokensRateMicro: rule.Micro, PeriodBudget: 1000, Period: rule.PeriodDay}}); err != nil {
		t.Fatal(err)
	}
	br.login(b.adminSecret)

	texts, flash, errorsOf := br.texts, br.flash, br.formErrors
	// cols is a table row's cells by data-col, "name=value" in order.
	cols := func(row string) []string {
		t.Helper()
		return texts(`Array.from(document.querySelectorAll('` + row + ` > [data-col]')).map(function (td) {
			return td.dataset.col + '=' + td.textContent.trim(); })`)
	}
	eventRows := `Array.from(document.querySelectorAll('#events-section tbody[data-event]')).map(function (tr) {
		return ['type', 'tenant', 'state', 'attempts'].map(function (c) { return tr.querySelector('[data-col="' + c + '"]').textContent.trim(); }).join(' ') +
			(tr.querySelector('[data-col="delivered"]').textContent.trim() ? ' at' : ' -') +
			(tr.querySelector('form.redeliver') ? ' [redeliver]' : '') + ' | ' +
			Array.from(tr.querySelectorAll('.attempt-log tbody tr')).map(function (a) {
				return ['attempt', 'replica', 'outcome', 'status', 'error'].map(function (c) { return a.querySelector('[data-col="' + c + '"]').textContent; }).join(' ').trim();
			}).join(' | '); })`
	reserve := func(n int) {
		t.Helper()
		for range n {
			if _, err := b.store.Reserve(ctx, account.ReserveParams{TenantID: "acme", Estimate: estimator.Estimate{Model: "gpt-4o",
				InputTokens: 50, OutputTokens: 50, Cost: 100, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// confirmAll answers the current document's confirm dialogs yes.
	confirmAll := func() {
		t.Helper()
		eval[bool](br, `window.confirm = function () { return true; }; true`)
	}
	dispatch := func(d *alert.Dispatcher, want int) {
		t.Helper()
		d.Store, d.Replica, d.Client = alerts, "r1", rc.srv.Client()
		n, err := d.Once(ctx)
		if err != nil || n != want {
			t.Fatalf("dispatch: %d delivered, %v; want %d", n, err, want)
		}
	}

	// 1. The page, from the nav: alerts are on, nothing is configured.
	br.navigate("/")
	br.do("open Alerts", submit(`.nav a[href="/alerts"]`), chromedp.WaitVisible(chromedp.CSS("#endpoints-section")))
	if got := eval[string](br, `document.querySelector('.nav a[aria-current="page"]').textContent`); got != "Alerts" {
		t.Errorf("the nav marks %q", got)
	}
	if eval[bool](br, `document.getElementById('alerts-off') !== null`) {
		t.Fatal("the page says alerts are off on a server with a key")
	}
	br.noViolations("alerts page")

	// 2. An endpoint through the form: its secret shows once, and a
	// reload neither shows it nor creates another endpoint.
	br.do("create an endpoint",
		chromedp.SetValue(chromedp.CSS("#ep-url"), rc.srv.URL+"/hooks/tokengate"),
		chromedp.SetValue(chromedp.CSS("#ep-description"), "on-call pager"),
		submit(`#create-endpoint button[type="submit"]`),
		chromedp.WaitVisible(chromedp.CSS("#new-secret-value")))
	secret := strings.TrimSpace(eval[string](br, `document.getElementById('new-secret-value').textContent`))
	if !alertSecretPattern.MatchString(secret) {
		t.Fatalf("the secret reads %q", secret)
	}
	if got := eval[string](br, `document.getElementById('new-secret').textContent`); !strings.Contains(got, "This is the only time it is shown") {
		t.Errorf("the secret box says %q", got)
	}
	if p := br.path(); p != "/alerts" {
		t.Errorf("the secret's page has the address %s, want /alerts", p)
	}
	eps, err := alerts.Endpoints(ctx)
	if err != nil || len(eps) != 1 {
		t.Fatalf("endpoints after the form: %+v %v", eps, err)
	}
	ep := eps[0]
	endpointRow := `#endpoints-section tr[data-endpoint="` + ep.ID + `"]`
	if got := cols(endpointRow); !slices.Equal(got, []string{"url=" + rc.srv.URL + "/hooks/tokengate", "description=on-call pager",
		"created=" + ep.CreatedAt.UTC().Format("2006-01-02 15:04:05"), "disabled=no", "pending=0", "failed=0"}) {
		t.Errorf("the endpoint's row: %q", got)
	}
	br.do("reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#endpoints-section")))
	if shown := eval[bool](br, fmt.Sprintf(`document.getElementById('new-secret') !== null || document.documentElement.outerHTML.includes(%q)`, secret)); shown {
		t.Fatal("the secret is still shown after a reload")
	}
	if n := b.count(t, `SELECT count(*) FROM alert_endpoints`); n != 1 {
		t.Fatalf("%d endpoints after the reload: the reload resubmitted the form", n)
	}
	rc.set(secret, false)

	// 3. A rule with a threshold of 0 % is refused next to the field, the
	// form comes back as sent, and no rule is created.
	br.do("create a refused rule",
		chromedp.SetValue(chromedp.CSS("#rule-tenant"), "acme"),
		chromedp.SetValue(chromedp.CSS("#rule-thresholds"), "0"),
		submit(`#create-rule button[type="submit"]`))
	const zeroErr = "thresholds: each must be a percentage from 1 to 1000"
	if got := errorsOf("#create-rule"); !slices.Equal(got, []string{zeroErr, zeroErr}) {
		t.Errorf("the refused rule shows %q", got)
	}
	if got := eval[string](br, `['tenant', 'endpoint', 'kind', 'thresholds'].map(function (n) { return document.getElementById('rule-' + n).value; }).join(' ')`); got != "acme "+ep.ID+" period_budget 0" {
		t.Errorf("the refused rule came back as %q", got)
	}
	if n := b.count(t, `SELECT count(*) FROM alert_rules`); n != 0 {
		t.Fatalf("%d rules after the refused form", n)
	}

	// 4. A period_budget rule for acme at 50 and 100 %.
	br.navigate("/alerts")
	br.do("create a rule",
		chromedp.SetValue(chromedp.CSS("#rule-tenant"), "acme"),
		chromedp.SetValue(chromedp.CSS("#rule-kind"), "period_budget"),
		chromedp.SetValue(chromedp.CSS("#rule-thresholds"), "100, 50"),
		submit(`#create-rule button[type="submit"]`))
	flash("Rule created")
	rules, err := alerts.Rules(ctx, "")
	if err != nil || len(rules) != 1 {
		t.Fatalf("rules after the form: %+v %v", rules, err)
	}
	ruleRow := fmt.Sprintf(`#rules-section tr[data-rule="%d"]`, rules[0].ID)
	if got := cols(ruleRow); !slices.Equal(got, []string{"tenant=acme", "endpoint=" + ep.ID, "kind=period_budget", "details=50%, 100%"}) {
		t.Errorf("the rule's row: %q", got)
	}
	br.noViolations("alerts page with a rule")

	// 5. Six admissions of 100 spend 600 of the 1000 budget, crossing 50 %
	// once; the dispatcher delivers the event, signed with the secret the
	// page showed.
	reserve(6)
	dispatch(&alert.Dispatcher{}, 1)
	delivered, _, forged := rc.counts()
	if len(delivered) != 1 || len(forged) != 0 {
		t.Fatalf("the receiver got %q verified, %q not", delivered, forged)
	}
	br.do("reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#events-section")))
	if got := texts(eventRows); !slices.Equal(got, []string{
		"budget.threshold_crossed acme delivered 1 at | 1 r1 delivered 200",
	}) {
		t.Errorf("the delivery log: %q", got)
	}
	if got := eval[string](br, `document.querySelector('#events-section tbody[data-event] [data-col="duration"]').textContent`); !strings.HasSuffix(got, " ms") {
		t.Errorf("the attempt's duration reads %q", got)
	}
	if got := eval[string](br, `document.querySelector('#events-section tbody[data-event]').dataset.event`); got != delivered[0] {
		t.Errorf("the log shows event %s, the receiver got %s", got, delivered[0])
	}

	// 6. Rotating the secret shows the new one once; the old one no
	// longer verifies.
	confirmAll()
	br.do("rotate", submit(endpointRow+` form.rotate button`), chromedp.WaitVisible(chromedp.CSS("#new-secret-value")))
	rotated := strings.TrimSpace(eval[string](br, `document.getElementById('new-secret-value').textContent`))
	if !alertSecretPattern.MatchString(rotated) || rotated == secret {
		t.Fatalf("the rotated secret reads %q (the old was %q)", rotated, secret)
	}
	if got := eval[string](br, `document.querySelector('#new-secret h2').textContent`); got != "New signing secret of "+ep.ID {
		t.Errorf("the rotated secret's heading: %q", got)
	}
	if p := br.path(); p != "/alerts" {
		t.Errorf("the rotated secret's page has the address %s", p)
	}

	// 7. Four more admissions reach 100 %. The receiver is down, and the
	// dispatcher gives up at once: the event is failed, with its attempt.
	rc.set(rotated, true)
	reserve(4)
	dispatch(&alert.Dispatcher{GiveUpAfter: time.Nanosecond}, 0)
	if _, refused, forged := rc.counts(); refused != 1 || len(forged) != 0 {
		t.Fatalf("the receiver refused %d, found %q forged; want 1 refused and the new secret to verify", refused, forged)
	}
	br.navigate("/alerts")
	if got := texts(eventRows); !slices.Equal(got, []string{
		"budget.threshold_crossed acme failed 1 - [redeliver] | 1 r1 failed 503 answered 503",
		"budget.threshold_crossed acme delivered 1 at | 1 r1 delivered 200",
	}) {
		t.Errorf("the delivery log with a failed event: %q", got)
	}
	if got := cols(endpointRow)[4:]; !slices.Equal(got, []string{"pending=0", "failed=1"}) {
		t.Errorf("the endpoint's counts: %q", got)
	}
	if !eval[bool](br, `document.querySelector('#events-section tbody.state-failed details').open`) {
		t.Error("a failed event's attempts are not shown open")
	}

	// The filter: failed events only, in the address.
	br.do("filter failed events", chromedp.SetValue(chromedp.CSS("#ev-state"), "failed"), submit(`#events-filter button[type="submit"]`))
	if p := br.path(); p != "/alerts?state=failed&tenant=&endpoint=" {
		t.Errorf("the filter's address: %s", p)
	}
	if got := texts(eventRows); len(got) != 1 || !strings.Contains(got[0], " failed ") {
		t.Errorf("the failed events: %q", got)
	}

	// 8. Redeliver: pending again, then delivered by the next round.
	br.do("redeliver", submit(`#events-section tbody.state-failed form.redeliver button`))
	flash("Event put back in the outbox")
	if got := texts(eventRows); !strings.HasPrefix(got[0], "budget.threshold_crossed acme pending 1 - | 1 r1 failed 503") {
		t.Errorf("after redelivering: %q", got)
	}
	rc.set(rotated, false)
	dispatch(&alert.Dispatcher{}, 1)
	br.do("reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#events-section")))
	if got := texts(eventRows); !slices.Equal(got, []string{
		"budget.threshold_crossed acme delivered 2 at | 1 r1 failed 503 answered 503 | 2 r1 delivered 200",
		"budget.threshold_crossed acme delivered 1 at | 1 r1 delivered 200",
	}) {
		t.Errorf("the delivery log after redelivery: %q", got)
	}
	if delivered, _, forged := rc.counts(); len(delivered) != 2 || len(forged) != 0 {
		t.Errorf("the receiver verified %q, refused %q", delivered, forged)
	}

	// 9. Disable the endpoint: no more buttons, the rule shows it, and no
	// rule can be sent to it.
	confirmAll()
	br.do("disable", submit(endpointRow+` form.disable button`))
	flash("Endpoint disabled")
	if got := eval[string](br, `document.querySelector('`+endpointRow+` [data-col="disabled"]').textContent`); got == "no" || got == "" {
		t.Errorf("a disabled endpoint's row says disabled %q", got)
	}
	if n := eval[int](br, `document.querySelectorAll('`+endpointRow+` form').length`); n != 0 {
		t.Errorf("a disabled endpoint has %d forms", n)
	}
	if got := cols(ruleRow)[1]; got != "endpoint="+ep.ID+" disabled" {
		t.Errorf("the rule's endpoint reads %q", got)
	}
	if got := texts(`Array.from(document.querySelectorAll('#rule-endpoint option')).map(function (o) { return o.value + ':' + o.textContent; })`); !slices.Equal(got, []string{":no enabled endpoint: create one first"}) {
		t.Errorf("the rule form offers %q", got)
	}
	if n := b.count(t, `SELECT count(*) FROM alert_endpoints WHERE disabled_at IS NOT NULL`); n != 1 {
		t.Errorf("%d disabled endpoints, want 1", n)
	}

	// 10. Delete the rule.
	confirmAll()
	br.do("delete the rule", submit(ruleRow+` form.delete button`))
	flash("Rule deleted")
	if got := texts(`Array.from(document.querySelectorAll('#rules-section tbody tr')).map(function (tr) { return tr.textContent.trim(); })`); !slices.Equal(got, []string{"No rules: nothing raises alerts."}) {
		t.Errorf("after deleting, the rules are %q", got)
	}
	if rules, err := alerts.Rules(ctx, ""); err != nil || len(rules) != 0 {
		t.Errorf("rules after deleting: %+v %v", rules, err)
	}
	br.noViolations("alerts page at the end")

	// At a phone's width the page does not scroll sideways.
	br.do("phone width", chromedp.EmulateViewport(390, 844))
	br.navigate("/alerts")
	if sizes := eval[[]int](br, `[document.documentElement.scrollWidth, window.innerWidth]`); sizes[0] > sizes[1] {
		t.Errorf("phone: the alerts page is %d px wide in %d", sizes[0], sizes[1])
	}
	if logs := b.logs.String(); strings.Contains(logs, secret) || strings.Contains(logs, rotated) {
		t.Error("a signing secret reached the server's logs")
	}
	t.Logf("alerts scenario took %s", time.Since(start).Round(time.Millisecond))
}
