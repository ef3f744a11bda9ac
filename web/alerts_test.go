package web_test

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/web"
)

var (
	alertKey           = []byte("0123456789abcdef0123456789abcdef")
	alertSecretPattern = regexp.MustCompile(`whsec_[A-Za-z0-9_-]{43}`)
)

// setupAlerts is setup with an alert store that has a key, returned with
// the bundle so a test can dispatch its events.
func setupAlerts(t *testing.T) (*testBundle, *alert.Store) {
	t.Helper()
	var alerts *alert.Store
	b := setup(t, func(rc *replica.Config, _ *web.Config) {
		alerts = alert.NewStore(rc.DB, alertKey)
		rc.Alerts = alerts
	})
	return b, alerts
}

// TestAlertsPageWithoutKey: a server without an alert key says alerts are
// off instead of offering a form that cannot work, and a create that
// comes anyway (an old page) is answered 409 with the same notice.
func TestAlertsPageWithoutKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.client(t, "192.0.2.51")
	c.mustLogin()

	rec := c.get("/alerts")
	body := rec.Body.String()
	if rec.Code != http.StatusOK || !strings.Contains(body, `id="alerts-off"`) || !strings.Contains(body, "Alerts are off") ||
		strings.Contains(body, `id="create-endpoint"`) {
		t.Fatalf("GET /alerts without a key: %d\n%s", rec.Code, body)
	}
	if !strings.Contains(body, `<a href="/alerts" aria-current="page">Alerts</a>`) {
		t.Error("the nav does not mark Alerts")
	}

	csrf := c.csrf("/alerts")
	rec = c.post("/alerts/endpoints", url.Values{"csrf": {csrf}, "url": {"https://example.com/hook"}})
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), "Alerts are off") {
		t.Errorf("POST /alerts/endpoints without a key: %d, want 409 with the notice", rec.Code)
	}
	if n := b.count(t, `SELECT count(*) FROM alert_endpoints`); n != 0 {
		t.Errorf("%d endpoints created without a key", n)
	}
}

// TestAlertFormsRefuse: the alert forms need the CSRF token, answer a
// refused form (a private address, a NUL byte, a tenant that does not
// exist...) with the page and the field's reason (422) and change
// nothing, answer a missing endpoint, rule or event with a 404 page, and
// send a GET of a form's address back to the alerts page.
func TestAlertFormsRefuse(t *testing.T) {
	t.Parallel()
	b, alerts := setupAlerts(t)
	b.tenant(t, "acme", limits(1000, "1"))
	ep, _, err := alerts.CreateEndpoint(ctx, "https://example.com/hook", "")
	if err != nil {
		t.Fatal(err)
	}
	c := b.client(t, "192.0.2.52")
	c.mustLogin()

	for _, path := range []string{"/alerts/endpoints", "/alerts/endpoints/" + ep.ID + "/rotate", "/alerts/endpoints/" + ep.ID + "/disable",
		"/alerts/rules", "/alerts/rules/1/delete", "/alerts/events/evt_x/redeliver"} {
		if rec := c.post(path, url.Values{"url": {"https://example.com/x"}}); rec.Code != http.StatusForbidden {
			t.Errorf("POST %s without a CSRF token: %d, want 403", path, rec.Code)
		}
	}

	csrf := c.csrf("/alerts")
	rule := func(kv ...string) url.Values {
		v := url.Values{"endpoint": {ep.ID}, "kind": {"period_budget"}}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	for _, tc := range []struct {
		path string
		form url.Values
		want string
	}{
		{"/alerts/endpoints", url.Values{"url": {""}}, "url: is required"},
		{"/alerts/endpoints", url.Values{"url": {"http://example.com/hook"}}, "url: must be https://"},
		{"/alerts/endpoints", url.Values{"url": {"https://127.0.0.1:8443/hook"}}, "url: is not a public address"},
		{"/alerts/endpoints", url.Values{"url": {"https://localhost/hook"}}, "url: is a loopback name"},
		{"/alerts/endpoints", url.Values{"url": {"https://example.com/hook"}, "description": {strings.Repeat("d", 201)}}, "description: is longer than 200 characters"},
		{"/alerts/rules", rule("thresholds", "0"), "thresholds: each must be a percentage from 1 to 1000"},
		{"/alerts/rules", rule("thresholds", "50, eighty"), "thresholds: must be whole percentages separated by commas"},
		{"/alerts/rules", rule("thresholds", ""), "thresholds: must list 1 to 10 percentages"},
		{"/alerts/rules", rule("thresholds", "50", "tenant", "ghost"), "tenant: no such tenant"},
		{"/alerts/rules", rule("thresholds", "50", "endpoint", "ep_nope"), "endpoint: no such endpoint, or it is disabled"},
		{"/alerts/rules", rule("kind", "throttled", "sustain_minutes", "0"), "sustain_minutes: must be from 1 to 1440"},
		{"/alerts/rules", rule("kind", "throttled", "sustain_minutes", "99999999999"), "sustain_minutes: must be from 1 to 1440"},
		{"/alerts/rules", rule("kind", "throttled", "sustain_minutes", "5", "limit", "vibes"), "limit: must be one of"},
		{"/alerts/rules", rule("kind", "nope"), "kind: must be period_budget, throttled or invariant"},
	} {
		tc.form.Set("csrf", csrf)
		rec := c.post(tc.path, tc.form)
		if rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("POST %s %v: %d, want 422 naming %q", tc.path, tc.form, rec.Code, tc.want)
		}
	}
	// A NUL in any field is refused before the handler, by the dashboard's
	// text check: a 400 naming the field.
	for _, tc := range []struct {
		path  string
		form  url.Values
		field string
	}{
		{"/alerts/endpoints", url.Values{"url": {"https://example.com/\x00"}}, "url"},
		{"/alerts/endpoints", url.Values{"url": {"https://example.com/hook"}, "description": {"pager\x00"}}, "description"},
		{"/alerts/rules", rule("thresholds", "50", "tenant", "ac\x00me"), "tenant"},
		{"/alerts/rules", rule("thresholds", "50", "endpoint", ep.ID+"\x00"), "endpoint"},
	} {
		tc.form.Set("csrf", csrf)
		rec := c.post(tc.path, tc.form)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "“"+tc.field+"” must not contain a NUL character") {
			t.Errorf("POST %s %v: %d, want 400 naming %q", tc.path, tc.form, rec.Code, tc.field)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM alert_rules`); n != 0 {
		t.Errorf("%d rules after refused forms", n)
	}
	if n := b.count(t, `SELECT count(*) FROM alert_endpoints`); n != 1 {
		t.Errorf("%d endpoints after refused forms, want the one", n)
	}

	for _, tc := range []struct {
		path string
		want string
	}{
		{"/alerts/endpoints/ep_nope/rotate", "There is no enabled alert endpoint with that id"},
		{"/alerts/endpoints/ep_nope/disable", "There is no enabled alert endpoint with that id"},
		{"/alerts/rules/12345/delete", "There is no alert rule with that id"},
		{"/alerts/rules/x/delete", "There is no alert rule with that id"},
		{"/alerts/events/evt_nope/redeliver", "Only a failed event of an enabled endpoint can be redelivered"},
	} {
		rec := c.post(tc.path, url.Values{"csrf": {csrf}})
		if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("POST %s: %d, want 404 saying %q", tc.path, rec.Code, tc.want)
		}
	}

	if rec := c.get("/alerts?state=lost"); rec.Code != http.StatusBadRequest ||
		!strings.Contains(rec.Body.String(), "state: must be pending, delivered or failed") {
		t.Errorf("GET /alerts?state=lost: %d, want 400 naming the state", rec.Code)
	}
	for _, q := range []string{"tenant=%00", "endpoint=ep_%00"} {
		if rec := c.get("/alerts?" + q); rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "must not contain a NUL character") {
			t.Errorf("GET /alerts?%s: %d, want 400 naming the field", q, rec.Code)
		}
	}
	for _, path := range []string{"/alerts/endpoints", "/alerts/rules", "/alerts/endpoints/" + ep.ID + "/rotate", "/alerts/rules/1/delete"} {
		if rec := c.get(path); rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/alerts" {
			t.Errorf("GET %s: %d to %q, want 303 to /alerts", path, rec.Code, rec.Header().Get("Location"))
		}
	}
	// The secret of a created endpoint is on its answer only, never in a
	// header (a redirect's address, a cookie).
	rec := c.post("/alerts/endpoints", url.Values{"csrf": {csrf}, "url": {"https://example.com/other"}})
	m := alertSecretPattern.FindString(rec.Body.String())
	if rec.Code != http.StatusOK || m == "" {
		t.Fatalf("create endpoint: %d, secret %q", rec.Code, m)
	}
	for k, vs := range rec.Header() {
		for _, v := range vs {
			if strings.Contains(v, m) {
				t.Errorf("the secret is in the %s header", k)
			}
		}
	}
	if strings.Contains(b.logs.String(), m) {
		t.Error("the secret reached the server's logs")
	}
}
