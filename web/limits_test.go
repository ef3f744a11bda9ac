package web_test

import (
	"net/http"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

var wasField = regexp.MustCompile(`name="was_(\w+)" value="([^"]*)"`)

// limitsFormAsShown is what a browser sends for the tenant page's limits
// form left as it was shown: every field with the value the page showed
// (its hidden was value), and the was values themselves.
func limitsFormAsShown(t *testing.T, page, csrf string) url.Values {
	t.Helper()
	form := url.Values{"csrf": {csrf}}
	for _, m := range wasField.FindAllStringSubmatch(page, -1) {
		form.Set("was_"+m[1], m[2])
		if m[1] == "shadow" {
			for _, s := range strings.Split(m[2], ",") {
				if s != "" {
					form.Add("shadow", s)
				}
			}
			continue
		}
		form.Set(m[1], m[2])
	}
	// 11 limits, and the windows (windows_test.go posts their rows).
	if n := len(wasField.FindAllString(page, -1)); n != 12 {
		t.Fatalf("the limits form carries %d was fields, want 12", n)
	}
	return form
}

// TestLimitsFormSendsOnlyEditedFields: an admin opens the limits form; while
// it is open, another admin changes other limits. Saving the form with one
// field edited changes that field only: the other admin's changes stay. A
// form saved unedited changes nothing, and a refused one keeps the values
// the page was opened with.
func TestLimitsFormSendsOnlyEditedFields(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	l := limits(1000, "1")
	l.MaxConcurrent, l.RequestsCapacity, l.RequestsRateMicro = 4, 10, 2_000_000
	b.tenant(t, "acme", l)
	c := b.client(t, "192.0.2.31")
	c.mustLogin()
	csrf := c.csrf("/")

	page := c.get("/tenants/acme").Body.String()
	form := limitsFormAsShown(t, page, csrf)
	if form.Get("was_max_concurrent") != "4" || form.Get("was_tokens_capacity") != "1000" || form.Get("was_requests_per_second") != "2" {
		t.Fatalf("was values: %v", form)
	}

	// Another admin, meanwhile.
	if _, err := b.store.UpdateLimits(ctx, account.UpdateLimitsParams{TenantID: "acme", Actor: "other",
		Patch: rule.LimitsPatch{MaxConcurrent: rule.Set[int64](9), RequestsCapacity: rule.Unset[int64]()}}); err != nil {
		t.Fatal(err)
	}

	edited := cloneValues(form)
	edited.Set("tokens_capacity", "2,000")
	if rec := c.post("/tenants/acme/limits", edited); rec.Code != http.StatusSeeOther {
		t.Fatalf("save: %d %s", rec.Code, rec.Body.String())
	}
	s, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if l := s.Limits; l.TokensCapacity != 2000 || l.MaxConcurrent != 9 || l.RequestsCapacity != 0 || l.RequestsRateMicro != 0 {
		t.Fatalf("after saving tokens_capacity only: %+v; the other admin's max_concurrent 9 and removed request bucket must stay", l)
	}
	entries := b.count(t, `SELECT count(*) FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'limits'`)

	// Saved unedited: nothing to change.
	if rec := c.post("/tenants/acme/limits", form); rec.Code != http.StatusSeeOther {
		t.Fatalf("unedited save: %d %s", rec.Code, rec.Body.String())
	}
	if n := b.count(t, `SELECT count(*) FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'limits'`); n != entries {
		t.Fatalf("an unedited form wrote %d limits entries", n-entries)
	}
	if s2, _ := b.store.TenantSnapshot(ctx, "acme"); !reflect.DeepEqual(s2.Limits, s.Limits) {
		t.Fatalf("an unedited form changed %+v into %+v", s.Limits, s2.Limits)
	}

	// Refused edits name the field and keep the was values.
	for _, tc := range []struct{ field, value, want string }{
		{"max_concurrent", "0", "max_concurrent: must be between 1"},
		{"reservation_ttl", "1000000h", "reservation_ttl: must be between 1000 and 604800000"},
		{"reservation_ttl", "3000000h", "reservation_ttl: must be a duration"},
		{"max_wait", "11m", "max_wait: must be between 1 and 600000"},
		{"requests_capacity", "0", "requests_capacity: must be between 1"},
	} {
		bad := cloneValues(form)
		bad.Set(tc.field, tc.value)
		rec := c.post("/tenants/acme/limits", bad)
		if rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), tc.want) ||
			!strings.Contains(rec.Body.String(), `name="was_max_concurrent" value="4"`) {
			t.Errorf("%s=%s: %d, want 422 naming %q and keeping the was values", tc.field, tc.value, rec.Code, tc.want)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'limits'`); n != entries {
		t.Fatalf("refused forms wrote %d limits entries", n-entries)
	}
}

// TestCreateFormRefusesZeroCaps: on the create form too, 0 for an optional
// limit is refused naming the field (blank is none), where it used to
// create the tenant with no cap.
func TestCreateFormRefusesZeroCaps(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.client(t, "192.0.2.32")
	c.mustLogin()
	csrf := c.csrf("/")
	for _, field := range []string{"max_concurrent", "requests_capacity", "period_budget"} {
		form := url.Values{"csrf": {csrf}, "id": {"acme"}, "tokens_capacity": {"10"}, "tokens_per_second": {"1"}, field: {"0"}}
		rec := c.post("/tenants", form)
		if want := field + ": must be at least 1"; rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), want) {
			t.Errorf("create with %s 0: %d, want 422 naming %q", field, rec.Code, want)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM tenants`); n != 0 {
		t.Fatalf("%d tenants created", n)
	}
}

func cloneValues(v url.Values) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	return out
}
