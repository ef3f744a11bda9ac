package web_test

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// windowCells are the cells of the windows table's row of a tenant's
// window, by column.
func windowCells(br *browser, tenant, window string) map[string]string {
	br.t.Helper()
	return eval[map[string]string](br, `(function () {
		var out = {};
		var tr = document.querySelector('#windows-section tr[data-window-tenant="`+tenant+`"][data-window="`+window+`"]');
		if (!tr) { return out; }
		tr.querySelectorAll('[data-col]').forEach(function (td) { out[td.getAttribute('data-col')] = td.textContent.trim().replace(/\s+/g, ' '); });
		var t = tr.querySelector('time');
		if (t) { out.datetime = t.getAttribute('datetime'); }
		return out;
	})()`)
}

// TestBrowserWindowsFromTheLimitsForm: in Chromium, an admin adds two
// calendar windows to a tenant from the limits form (a soft money budget
// per Paris day resetting at 09:00, and tokens per New York week from
// Sunday); the page then shows each with used / limit, the ceiling, what
// its span cost in money, and its next reset on its own clock, and the
// overview shows them too. A bad window comes back naming its field
// (windows[i].money), on the row it was typed in even when a row above it
// is removed, and changes nothing.
func TestBrowserWindowsFromTheLimitsForm(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	base := serve(t, b)
	br := startBrowser(t, base)
	b.tenant(t, "acme", limits(10_000_000, "1000"))
	// gpt-4o at 2.50 in / 10.00 out per million tokens, from an hour ago.
	if _, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, effective_from, input_micro, output_micro, created_by)
		VALUES ('gpt-4o', now() - interval '1 hour', 2500000, 10000000, 'test')`); err != nil {
		t.Fatal(err)
	}
	br.login(b.adminSecret)
	br.navigate("/tenants/acme")
	if got := eval[string](br, `document.querySelector('#windows-section').textContent`); !strings.Contains(got, "No calendar windows") {
		t.Fatalf("windows section of a tenant without any: %q", got)
	}

	br.do("add two windows",
		chromedp.SetValue(chromedp.CSS("#win0-name"), "daily"),
		chromedp.SetValue(chromedp.CSS("#win0-unit"), "day"),
		chromedp.SetValue(chromedp.CSS("#win0-zone"), "Europe/Paris"),
		chromedp.SetValue(chromedp.CSS("#win0-reset"), "09:00"),
		chromedp.SetValue(chromedp.CSS("#win0-counts"), "money"),
		chromedp.SetValue(chromedp.CSS("#win0-amount"), "25.50"),
		chromedp.SetValue(chromedp.CSS("#win0-overage"), "10"),
		chromedp.SetValue(chromedp.CSS("#win0-thresholds"), "50, 80"),
		chromedp.SetValue(chromedp.CSS("#win1-name"), "weekly"),
		chromedp.SetValue(chromedp.CSS("#win1-unit"), "week"),
		chromedp.SetValue(chromedp.CSS("#win1-zone"), "America/New_York"),
		chromedp.SetValue(chromedp.CSS("#win1-week"), "sunday"),
		chromedp.SetValue(chromedp.CSS("#win1-amount"), "1,000,000"),
		submit(`#limits button[type="submit"]`))
	br.flash("Limits saved.")
	s, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	ws := s.Limits.Windows
	if len(ws) != 2 || ws[0].Name != "daily" || ws[0].Counts != rule.CountMoney || ws[0].Limit != 25_500_000 || ws[0].OveragePercent != 10 ||
		ws[0].ResetAt != 9*time.Hour || ws[0].Location.String() != "Europe/Paris" || !reflect.DeepEqual(ws[0].Thresholds, []int64{50, 80}) ||
		ws[1].Name != "weekly" || ws[1].Counts != rule.CountTokens || ws[1].Limit != 1_000_000 || ws[1].Unit != rule.WindowWeek ||
		ws[1].WeekStart != time.Sunday || ws[1].Location.String() != "America/New_York" {
		t.Fatalf("windows saved from the form: %+v", ws)
	}
	// The form shows them back as rows, with a blank one to add another.
	if got := eval[[]string](br, `[document.querySelector('#win0-name').value, document.querySelector('#win0-counts').value, document.querySelector('#win1-week').value, document.querySelector('#win2-name').value]`); !reflect.DeepEqual(got, []string{"daily", "money", "sunday", ""}) {
		t.Fatalf("the form's rows after saving: %q", got)
	}

	// 100 000 in at 2.50 + 20 000 out at 10.00 per million = 0.45 spent.
	if _, err := b.store.Reserve(ctx, account.ReserveParams{TenantID: "acme", Estimate: estimator.Estimate{Model: "gpt-4o",
		InputTokens: 100_000, OutputTokens: 20_000, Cost: 120_000, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}); err != nil {
		t.Fatal(err)
	}
	br.navigate("/tenants/acme")
	now := time.Now()
	daily := windowCells(br, "acme", "daily")
	wantReset := ws[0].Next(now).In(ws[0].Location)
	if daily["counts"] != "money per day" || daily["used"] != "0.45 USD / 25.50 USD" || !strings.HasPrefix(daily["ceiling"], "28.05 USD") ||
		daily["spent"] != "0.45 USD" || daily["resets"] != "resets "+wantReset.Format("2006-01-02")+" 09:00 Europe/Paris" ||
		daily["datetime"] != wantReset.Format(time.RFC3339) || !strings.HasSuffix(daily["datetime"], "T09:00:00+01:00") {
		t.Fatalf("the daily window shows %q; want 0.45 of 25.50 USD, ceiling 28.05, reset at 09:00 Paris (%s)", daily, wantReset)
	}
	weekly := windowCells(br, "acme", "weekly")
	wantWeek := ws[1].Next(now).In(ws[1].Location)
	if weekly["counts"] != "tokens per week" || weekly["used"] != "120,000 / 1,000,000" || weekly["ceiling"] != "—" ||
		weekly["spent"] != "0.45 USD" || weekly["resets"] != "resets "+wantWeek.Format("2006-01-02")+" 00:00 America/New_York" ||
		wantWeek.Weekday() != time.Sunday {
		t.Fatalf("the weekly tokens window shows %q; want 120,000 of 1,000,000, 0.45 USD spent, reset Sunday 00:00 New York (%s)", weekly, wantWeek)
	}
	// The page's live script moves the windows with the rest, without a
	// reload: a second admission of 0.45 shows as 0.90 used and spent on
	// the daily window, and as 240,000 on the weekly one's text and gauge.
	weeklyFill := `parseFloat(document.querySelector('#windows-section tr[data-window-tenant="acme"][data-window="weekly"] [data-gauge] .fill').getAttribute('width'))`
	fillBefore := eval[float64](br, weeklyFill)
	br.waitFor("the live script's first answer", `document.getElementById('live-status').textContent.startsWith('live ·')`, 10*time.Second)
	if _, err := b.store.Reserve(ctx, account.ReserveParams{TenantID: "acme", Estimate: estimator.Estimate{Model: "gpt-4o",
		InputTokens: 100_000, OutputTokens: 20_000, Cost: 120_000, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}); err != nil {
		t.Fatal(err)
	}
	row := `document.querySelector('#windows-section tr[data-window-tenant="acme"][data-window="%s"] [data-col="%s"]').textContent.trim()`
	br.waitFor("the windows' live update", fmt.Sprintf(row, "daily", "used")+` === '0.90 USD / 25.50 USD' && `+fmt.Sprintf(row, "daily", "spent")+` === '0.90 USD' && `+
		fmt.Sprintf(row, "weekly", "used")+` === '240,000 / 1,000,000' && `+weeklyFill+` > `+strconv.FormatFloat(fillBefore, 'f', -1, 64), 10*time.Second)
	if got := windowCells(br, "acme", "daily"); got["resets"] != daily["resets"] || got["datetime"] != daily["datetime"] {
		t.Fatalf("the live update moved the daily reset: %q, was %q", got, daily)
	}
	// The ledger's money shows with the currency in the recent entries.
	if got := br.texts(`Array.from(document.querySelectorAll('#entries-section td[data-col="money"]')).map(function (e) { return e.textContent.trim(); })`); !slices.Contains(got, "0.45 USD") {
		t.Fatalf("recent entries' money: %q, want the reserve's 0.45 USD", got)
	}
	br.noViolations("tenant page with windows")
	br.navigate("/")
	if got := windowCells(br, "acme", "daily"); got["spent"] != "0.90 USD" || got["resets"] != daily["resets"] {
		t.Fatalf("the overview's daily window: %q", got)
	}

	// A bad money amount names windows[0].money; nothing changes, and the
	// refused form comes back with as many rows as it had.
	br.navigate("/tenants/acme")
	rowCount := `document.querySelectorAll('#limits fieldset.window-row').length`
	if n := eval[int](br, rowCount); n != 4 {
		t.Fatalf("two windows show %d rows, want 4 (two blank)", n)
	}
	br.do("bad money",
		chromedp.SetValue(chromedp.CSS("#win0-amount"), "12.3456789"),
		submit(`#limits button[type="submit"]`))
	if errs := br.formErrors("#limits"); len(errs) == 0 || !strings.HasPrefix(errs[0], "windows[0].money: must be a decimal amount") {
		t.Fatalf("bad money: %q", errs)
	}
	if got := eval[string](br, `document.querySelector('#win0-amount').value`); got != "12.3456789" {
		t.Fatalf("the refused form lost what was typed: %q", got)
	}
	if n := eval[int](br, rowCount); n != 4 {
		t.Fatalf("the refused form shows %d rows, want 4", n)
	}
	if got := eval[string](br, `(document.querySelector('#win0-amount').closest('.field').querySelector('.field-error') || {}).textContent`); !strings.HasPrefix(got, "windows[0].money: ") {
		t.Fatalf("the row's own error: %q", got)
	}
	if s2, _ := b.store.TenantSnapshot(ctx, "acme"); !reflect.DeepEqual(s2.Limits, s.Limits) {
		t.Fatalf("a refused form changed %+v into %+v", s.Limits, s2.Limits)
	}
	// Row 0 removed, a bad zone in row 1: the error names row 1.
	br.navigate("/tenants/acme")
	br.do("remove a row, bad zone in the next",
		chromedp.Click(chromedp.CSS("#win0-remove")),
		chromedp.SetValue(chromedp.CSS("#win1-zone"), "Mars/Olympus"),
		submit(`#limits button[type="submit"]`))
	if errs := br.formErrors("#limits"); len(errs) == 0 || !strings.HasPrefix(errs[0], "windows[1].time_zone: ") {
		t.Fatalf("bad zone under a removed row: %q", errs)
	}
	if s2, _ := b.store.TenantSnapshot(ctx, "acme"); !reflect.DeepEqual(s2.Limits, s.Limits) {
		t.Fatalf("a refused form changed %+v into %+v", s.Limits, s2.Limits)
	}
	// Removing one keeps the other, with what it used.
	br.navigate("/tenants/acme")
	br.do("remove the daily window",
		chromedp.Click(chromedp.CSS("#win0-remove")),
		submit(`#limits button[type="submit"]`))
	br.flash("Limits saved.")
	s3, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil || len(s3.Windows) != 1 || s3.Windows[0].Name != "weekly" || s3.Windows[0].Used != 240_000 {
		t.Fatalf("after removing daily: %+v %v", s3.Windows, err)
	}
}
