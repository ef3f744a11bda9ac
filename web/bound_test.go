package web_test

import (
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/rule"
)

// A tenant out of money read "no period budget" beside "why:
// period_budget" (issue 36): its page names the window that refused, and
// shows that window's gauge where the period budget would be.
func TestTenantPageNamesTheWindowThatBound(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	if _, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, effective_from, input_micro, output_micro, created_by)
		VALUES ('gpt-4o', now() - interval '1 hour', 2500000, 10000000, 'test')`); err != nil {
		t.Fatal(err)
	}
	l := limits(2_000_000, "1000")
	money := "0.0015" // one call of 100 output tokens (about 0.001), not two
	ws, err := rule.ParseWindows([]rule.WindowJSON{{Name: "daily", Unit: "day", Money: &money}})
	if err != nil {
		t.Fatal(err)
	}
	l.Windows = ws
	key := b.tenant(t, "acme", l)
	if rec := b.admit(t, key, 100); rec.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", rec.Code, rec.Body.String())
	}
	if rec := b.admit(t, key, 100); rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), "budget_exhausted") {
		t.Fatalf("second: %d %s", rec.Code, rec.Body.String())
	}
	if err := b.rejections.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c := b.client(t, "192.0.2.61")
	c.mustLogin()
	rec := c.get("/tenants/acme")
	if rec.Code != http.StatusOK {
		t.Fatalf("page: %d", rec.Code)
	}
	page := html.UnescapeString(rec.Body.String())
	why := regexp.MustCompile(`data-field="why"[^>]*>([^<]*)<`).FindStringSubmatch(page)
	if why == nil || why[1] != "period_budget (window daily)" {
		t.Errorf("why: %q, want the window that refused", why)
	}
	hint := regexp.MustCompile(`id="period-hint">([^<]*)<`).FindStringSubmatch(page)
	if hint == nil || !strings.HasPrefix(hint[1], "window daily: money per day, resets ") {
		t.Errorf("period hint %q", hint)
	}
	if strings.Contains(page, "no period budget") || !strings.Contains(page, "Budget window daily") {
		t.Errorf("the page does not show the window in place of the period budget")
	}
	period := regexp.MustCompile(`data-field="period">([^<]*)<`).FindStringSubmatch(page)
	if period == nil || !strings.HasSuffix(period[1], " / 0.0015 USD") {
		t.Errorf("period gauge %q, want what is left of 0.0015 USD", period)
	}
}
