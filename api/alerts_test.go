package api_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/rule"
)

// Alerts over HTTP: endpoints (secret shown once, https only), rules of
// each kind with field errors, the event a real admission raises when it
// crosses a threshold, and the answers for what does not exist.
func TestAlertsOverHTTP(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, func(c *testConfig) { c.Alerts = alert.NewStore(c.DB, []byte("0123456789abcdef0123456789abcdef")) })
	admin := b.admin(t, "ops")
	l := lim(1_000_000, "1000")
	l.PeriodBudget, l.Period = 1000, rule.PeriodDay
	key := b.tenant(t, "acme", l)

	for body, field := range map[string]string{
		`{"url":"http://example.com/hook"}`:          "url",
		`{"url":""}`:                                 "url",
		`{"url":"https://example.com/","color":"x"}`: "color",
	} {
		if r := b.adminCall(t, admin, http.MethodPost, "/v1/admin/alerts/endpoints", body); r.Code != http.StatusBadRequest || r.errorBody().Error.Field != field {
			t.Fatalf("%s: %d %s, want 400 on %s", body, r.Code, r.Body, field)
		}
	}
	r := b.adminCall(t, admin, http.MethodPost, "/v1/admin/alerts/endpoints", `{"url":"https://example.com/hook","description":"ops pager"}`)
	var created struct {
		Endpoint alert.Endpoint
		Secret   string
	}
	r.json(&created)
	if r.Code != http.StatusCreated || !strings.HasPrefix(created.Secret, "whsec_") || created.Endpoint.ID == "" {
		t.Fatalf("create endpoint: %d %s", r.Code, r.Body)
	}
	// The list never shows a secret.
	if r := b.adminCall(t, admin, http.MethodGet, "/v1/admin/alerts/endpoints", ""); r.Code != http.StatusOK ||
		strings.Contains(r.Body.String(), created.Secret) || !strings.Contains(r.Body.String(), "ops pager") {
		t.Fatalf("list: %d %s", r.Code, r.Body)
	}
	ep := created.Endpoint.ID
	for body, field := range map[string]string{
		`{"endpoint":"` + ep + `","kind":"period_budget","thresholds":[0]}`:              "thresholds",
		`{"endpoint":"` + ep + `","kind":"throttled"}`:                                   "sustain_minutes",
		`{"endpoint":"` + ep + `","kind":"throttled","sustain_minutes":5,"limit":"fun"}`: "limit",
		`{"endpoint":"ep_nope","kind":"invariant"}`:                                      "endpoint",
		`{"endpoint":"` + ep + `","kind":"invariant","tenant":"ghost"}`:                  "tenant",
		`{"endpoint":"` + ep + `","kind":"nap"}`:                                         "kind",
		`{"endpoint":"` + ep + `","kind":"invariant","thresholds":"50"}`:                 "thresholds",
	} {
		if r := b.adminCall(t, admin, http.MethodPost, "/v1/admin/alerts/rules", body); r.Code != http.StatusBadRequest || r.errorBody().Error.Field != field {
			t.Fatalf("%s: %d %s, want 400 on %s", body, r.Code, r.Body, field)
		}
	}
	if r := b.adminCall(t, admin, http.MethodPost, "/v1/admin/alerts/rules", `{"endpoint":"`+ep+`","kind":"period_budget","tenant":"acme","thresholds":[50,100]}`); r.Code != http.StatusCreated {
		t.Fatalf("rule: %d %s", r.Code, r.Body)
	}
	r = b.adminCall(t, admin, http.MethodPost, "/v1/admin/alerts/rules", `{"endpoint":"`+ep+`","kind":"throttled","sustain_minutes":5}`)
	var throttled alert.Rule
	r.json(&throttled)
	if r.Code != http.StatusCreated || throttled.TenantID != nil || *throttled.SustainMinutes != 5 {
		t.Fatalf("rule for every tenant: %d %s", r.Code, r.Body)
	}

	// Two admissions of about 300 tokens: the second crosses 50 %.
	for range 2 {
		if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(300, "x")); r.Code != http.StatusCreated {
			t.Fatalf("admit: %d %s", r.Code, r.Body)
		}
	}
	r = b.adminCall(t, admin, http.MethodGet, "/v1/admin/alerts/events?tenant=acme&state=pending", "")
	var list struct{ Events []alert.Event }
	r.json(&list)
	if r.Code != http.StatusOK || len(list.Events) != 1 || list.Events[0].Type != alert.TypeThresholdCrossed ||
		!strings.Contains(string(list.Events[0].Data), `"threshold_percent":50`) {
		t.Fatalf("events: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, admin, http.MethodGet, "/v1/admin/alerts/events?state=lost", ""); r.Code != http.StatusBadRequest || r.errorBody().Error.Field != "state" {
		t.Fatalf("bad state: %d %s", r.Code, r.Body)
	}
	// A pending event cannot be redelivered; unknown things are 404.
	for method, path := range map[string]string{
		http.MethodPost + " 1":   "/v1/admin/alerts/events/" + list.Events[0].ID + "/redeliver",
		http.MethodPost + " 2":   "/v1/admin/alerts/endpoints/ep_nope/rotate",
		http.MethodDelete + " 1": "/v1/admin/alerts/rules/999999",
		http.MethodDelete + " 2": "/v1/admin/alerts/rules/abc",
	} {
		if r := b.adminCall(t, admin, strings.Fields(method)[0], path, ""); r.Code != http.StatusNotFound {
			t.Fatalf("%s %s: %d %s", method, path, r.Code, r.Body)
		}
	}
	r = b.adminCall(t, admin, http.MethodPost, "/v1/admin/alerts/endpoints/"+ep+"/rotate", "")
	if r.Code != http.StatusOK || strings.Contains(r.Body.String(), created.Secret) || !strings.Contains(r.Body.String(), "whsec_") {
		t.Fatalf("rotate: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, admin, http.MethodDelete, "/v1/admin/alerts/rules/"+itoa(throttled.ID), ""); r.Code != http.StatusNoContent {
		t.Fatalf("delete rule: %d %s", r.Code, r.Body)
	}
	if r := b.adminCall(t, admin, http.MethodDelete, "/v1/admin/alerts/endpoints/"+ep, ""); r.Code != http.StatusNoContent {
		t.Fatalf("disable: %d %s", r.Code, r.Body)
	}
	// Tenants cannot reach any of it.
	if r := b.call(t, key, http.MethodGet, "/v1/admin/alerts/events", ""); r.Code != http.StatusUnauthorized {
		t.Fatalf("a tenant key: %d", r.Code)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// Without an alert key, endpoints cannot be created: a clear 409, not 500.
func TestAlertsWithoutKeyAreOff(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	admin := b.admin(t, "ops")
	r := b.adminCall(t, admin, http.MethodPost, "/v1/admin/alerts/endpoints", `{"url":"https://example.com/hook"}`)
	if r.Code != http.StatusConflict || r.errorBody().Error.Type != "alerts_not_configured" {
		t.Fatalf("%d %s", r.Code, r.Body)
	}
}

// Alert input the store cannot take, or must not: a NUL byte in any text
// field or filter is a 400 naming it (not a 500), an id holding one names
// nothing (404), an endpoint at a private address is refused by default
// (400 on url), and a rule for a tenant that does not exist is a 400 on
// tenant. Nothing is stored.
func TestAlertsRefuseBadInput(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, func(c *testConfig) { c.Alerts = alert.NewStore(c.DB, []byte("0123456789abcdef0123456789abcdef")) })
	admin := b.admin(t, "ops")
	b.tenant(t, "acme", lim(1_000_000, "1000"))
	r := b.adminCall(t, admin, http.MethodPost, "/v1/admin/alerts/endpoints", `{"url":"https://example.com/hook"}`)
	var created struct{ Endpoint alert.Endpoint }
	r.json(&created)
	if r.Code != http.StatusCreated {
		t.Fatalf("create endpoint: %d %s", r.Code, r.Body)
	}
	ep := created.Endpoint.ID
	for _, c := range []struct{ method, path, body, field string }{
		{http.MethodPost, "/v1/admin/alerts/endpoints", `{"url":"https://example.com/\u0000"}`, "url"},
		{http.MethodPost, "/v1/admin/alerts/endpoints", `{"url":"https://example.com/","description":"a\u0000b"}`, "description"},
		{http.MethodPost, "/v1/admin/alerts/endpoints", `{"url":"https://10.0.0.7/hook"}`, "url"},
		{http.MethodPost, "/v1/admin/alerts/endpoints", `{"url":"https://[::1]:8443/hook"}`, "url"},
		{http.MethodPost, "/v1/admin/alerts/endpoints", `{"url":"https://169.254.169.254/latest"}`, "url"},
		{http.MethodPost, "/v1/admin/alerts/rules", `{"endpoint":"` + ep + `","kind":"invariant","tenant":"ac\u0000me"}`, "tenant"},
		{http.MethodPost, "/v1/admin/alerts/rules", `{"endpoint":"` + ep + `\u0000","kind":"invariant"}`, "endpoint"},
		{http.MethodPost, "/v1/admin/alerts/rules", `{"endpoint":"` + ep + `","kind":"invariant","tenant":"nobody"}`, "tenant"},
		{http.MethodGet, "/v1/admin/alerts/rules?tenant=acme%00", "", "tenant"},
		{http.MethodGet, "/v1/admin/alerts/events?tenant=%00", "", "tenant"},
		{http.MethodGet, "/v1/admin/alerts/events?endpoint=ep_%00", "", "endpoint"},
	} {
		r := b.adminCall(t, admin, c.method, c.path, c.body)
		if r.Code != http.StatusBadRequest || r.errorBody().Error.Field != c.field {
			t.Errorf("%s %s %s: %d %s, want 400 on %s", c.method, c.path, c.body, r.Code, r.Body, c.field)
		}
	}
	// A NUL in an id is refused at the edge, naming the path parameter.
	for _, c := range []struct{ method, path, field string }{
		{http.MethodPost, "/v1/admin/alerts/endpoints/ep_%00/rotate", "endpoint"},
		{http.MethodDelete, "/v1/admin/alerts/endpoints/ep_%00", "endpoint"},
		{http.MethodPost, "/v1/admin/alerts/events/evt_%00/redeliver", "event"},
	} {
		if r := b.adminCall(t, admin, c.method, c.path, ""); r.Code != http.StatusBadRequest || r.errorBody().Error.Field != c.field {
			t.Errorf("%s %s: %d %s, want 400 on %s", c.method, c.path, r.Code, r.Body, c.field)
		}
	}
	var endpoints, rules int
	if err := b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM alert_endpoints), (SELECT count(*) FROM alert_rules)`).Scan(&endpoints, &rules); err != nil {
		t.Fatal(err)
	}
	if endpoints != 1 || rules != 0 {
		t.Fatalf("%d endpoints and %d rules stored, want 1 and 0", endpoints, rules)
	}
}
