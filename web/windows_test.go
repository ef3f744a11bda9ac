package web_test

import (
	"encoding/json"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

var wasWindows = regexp.MustCompile(`name="was_windows" value="([^"]*)"`)

// TestLimitsFormWindowsRows: the windows rows are sent in the patch only
// when edited, so another admin's change of the windows made while the
// form was open is not undone by saving another field; edited, they
// replace the list; a post without rows (a script) leaves the windows
// alone; and a row error never reaches the store.
func TestLimitsFormWindowsRows(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	l := limits(1000, "1")
	daily, err := rule.ParseWindows([]rule.WindowJSON{{Name: "daily", Unit: "day", TimeZone: "Europe/Paris", ResetAt: "09:00", Tokens: ptr(int64(5000))}})
	if err != nil {
		t.Fatal(err)
	}
	l.Windows = daily
	b.tenant(t, "acme", l)
	c := b.client(t, "192.0.2.32")
	c.mustLogin()
	csrf := c.csrf("/")
	page := c.get("/tenants/acme").Body.String()
	form := limitsFormAsShown(t, page, csrf)
	m := wasWindows.FindStringSubmatch(page)
	if m == nil {
		t.Fatal("no was_windows field")
	}
	form.Del("windows")
	form.Set("was_windows", html.UnescapeString(m[1]))
	row := url.Values{"win_rows_total": {"3"}, "win0_name": {"daily"}, "win0_unit": {"day"}, "win0_zone": {"Europe/Paris"},
		"win0_reset": {"09:00"}, "win0_week": {""}, "win0_counts": {"tokens"}, "win0_amount": {"5000"}, "win0_overage": {""}, "win0_thresholds": {""},
		"win1_unit": {"day"}, "win1_counts": {"tokens"}, "win2_unit": {"day"}, "win2_counts": {"tokens"}}
	for k, v := range row {
		form[k] = v
	}

	// Another admin adds a window meanwhile.
	hourly, err := rule.ParseWindows([]rule.WindowJSON{{Name: "daily", Unit: "day", TimeZone: "Europe/Paris", ResetAt: "09:00", Tokens: ptr(int64(5000))},
		{Name: "hourly", Unit: "hour", Tokens: ptr(int64(100))}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.UpdateLimits(ctx, account.UpdateLimitsParams{TenantID: "acme", Actor: "other", Patch: rule.LimitsPatch{Windows: rule.Set(hourly)}}); err != nil {
		t.Fatal(err)
	}
	names := func() []string {
		t.Helper()
		s, err := b.store.TenantSnapshot(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, w := range s.Limits.Windows {
			out = append(out, w.Name+":"+rule.FormatRate(w.Limit*rule.Micro))
		}
		return out
	}
	edited := cloneValues(form)
	edited.Set("tokens_capacity", "2000")
	if rec := c.post("/tenants/acme/limits", edited); rec.Code != http.StatusSeeOther {
		t.Fatalf("save tokens_capacity: %d %s", rec.Code, rec.Body.String())
	}
	if got := names(); len(got) != 2 || got[1] != "hourly:100" {
		t.Fatalf("saving another field undid the other admin's windows: %v", got)
	}
	// A script's post without rows leaves them too.
	if rec := c.post("/tenants/acme/limits", url.Values{"csrf": {csrf}, "tokens_capacity": {"3000"}, "tokens_per_second": {"1"}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("script post: %d", rec.Code)
	}
	if got := names(); len(got) != 2 {
		t.Fatalf("a post without rows changed the windows: %v", got)
	}
	// Edited rows replace the list.
	edited = cloneValues(form)
	edited.Set("win0_amount", "7,500")
	edited.Set("tokens_capacity", "3000")
	if rec := c.post("/tenants/acme/limits", edited); rec.Code != http.StatusSeeOther {
		t.Fatalf("save windows: %d %s", rec.Code, rec.Body.String())
	}
	if got := names(); len(got) != 1 || got[0] != "daily:7500" {
		t.Fatalf("edited rows: %v, want daily:7500 alone", got)
	}
	// A row's own error (not a number) names its field and saves nothing.
	for _, bad := range []struct{ field, value, want string }{
		{"win0_amount", "lots", "windows[0].tokens: must be a whole number"},
		{"win0_overage", "ten", "windows[0].overage_percent: must be a whole percent"},
		{"win0_thresholds", "50, high", "windows[0].thresholds: must be percents"},
		{"win0_unit", "fortnight", "windows[0].unit: must be"},
		{"win0_reset", "9am", `windows[0].reset_at: "9am": want a time of day`},
	} {
		edited = cloneValues(form)
		edited.Set(bad.field, bad.value)
		rec := c.post("/tenants/acme/limits", edited)
		if rec.Code != http.StatusUnprocessableEntity || !regexp.MustCompile(regexp.QuoteMeta(html.EscapeString(bad.want))).MatchString(rec.Body.String()) {
			t.Errorf("%s=%q: %d, want 422 naming %q", bad.field, bad.value, rec.Code, bad.want)
		}
		if got := names(); len(got) != 1 || got[0] != "daily:7500" {
			t.Fatalf("a refused form changed the windows: %v", got)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestCreateFormWindows: the overview's create form makes a tenant with
// its windows; a bad row names windows[row].field and creates nothing.
func TestCreateFormWindows(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.client(t, "192.0.2.33")
	c.mustLogin()
	csrf := c.csrf("/")
	if page := c.get("/").Body.String(); !regexp.MustCompile(`name="win1_name"`).MatchString(page) {
		t.Fatal("the create form has no window rows")
	}
	form := func(zone string) url.Values {
		return url.Values{"csrf": {csrf}, "id": {"acme"}, "tokens_capacity": {"1000"}, "tokens_per_second": {"1"},
			"win_rows_total": {"2"}, "win0_remove": {"1"}, "win0_name": {"ignored"}, "win0_amount": {"x"},
			"win1_name": {"monthly"}, "win1_unit": {"month"}, "win1_zone": {zone}, "win1_counts": {"money"}, "win1_amount": {"100"},
			"win1_overage": {"5"}}
	}
	rec := c.post("/tenants", form("Mars/Olympus"))
	if rec.Code != http.StatusUnprocessableEntity || !regexp.MustCompile(regexp.QuoteMeta("windows[1].time_zone: unknown time zone")).MatchString(rec.Body.String()) {
		t.Fatalf("bad zone: %d, want 422 naming windows[1].time_zone", rec.Code)
	}
	if _, err := b.store.TenantSnapshot(ctx, "acme"); err == nil {
		t.Fatal("a refused create made the tenant")
	}
	if rec := c.post("/tenants", form("Asia/Tokyo")); rec.Code != http.StatusSeeOther {
		t.Fatalf("create: %d %s", rec.Code, rec.Body.String())
	}
	s, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil || len(s.Limits.Windows) != 1 {
		t.Fatalf("created %+v: %v", s.Limits.Windows, err)
	}
	if w := s.Limits.Windows[0]; w.Name != "monthly" || w.Counts != rule.CountMoney || w.Limit != 100_000_000 || w.OveragePercent != 5 || w.Location.String() != "Asia/Tokyo" {
		t.Fatalf("created window %+v", w)
	}
}

// TestLimitsFormPeriodBudgetWithWindows: the period budget is the window
// named "period"; an admin who edits its amount and adds a window in one
// save gets both, the period kept.
func TestLimitsFormPeriodBudgetWithWindows(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	l := limits(1000, "1")
	l.PeriodBudget, l.Period = 5000, rule.PeriodMonth
	b.tenant(t, "acme", l)
	c := b.client(t, "192.0.2.34")
	c.mustLogin()
	csrf := c.csrf("/")
	page := c.get("/tenants/acme").Body.String()
	form := limitsFormAsShown(t, page, csrf)
	form.Del("windows")
	form.Set("was_windows", html.UnescapeString(wasWindows.FindStringSubmatch(page)[1]))
	if !regexp.MustCompile(`name="win0_name" value="period"`).MatchString(page) {
		t.Fatal("the period budget is not shown as the window named period")
	}
	for k, v := range map[string]string{"win_rows_total": "3", "win0_name": "period", "win0_unit": "month", "win0_zone": "UTC", "win0_reset": "00:00",
		"win0_counts": "tokens", "win0_amount": "5000", "win1_name": "hourly", "win1_unit": "hour", "win1_counts": "tokens", "win1_amount": "100",
		"period_budget": "6000"} {
		form.Set(k, v)
	}
	if rec := c.post("/tenants/acme/limits", form); rec.Code != http.StatusSeeOther {
		t.Fatalf("save: %d %s", rec.Code, rec.Body.String())
	}
	s, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, w := range s.Limits.Windows {
		got[w.Name] = w.Limit
	}
	if s.Limits.PeriodBudget != 6000 || s.Limits.Period != rule.PeriodMonth || len(got) != 2 || got["period"] != 6000 || got["hourly"] != 100 {
		t.Fatalf("period %d per %q, windows %v; want 6000 per month and hourly 100", s.Limits.PeriodBudget, s.Limits.Period, got)
	}
}

// TestTenantPageShowsEndUsersWindows: a tenant's page shows the windows of
// its end users (made from its template) beside its own, each with what
// its span cost; the tenant's own window counts its end users' spend.
func TestTenantPageShowsEndUsersWindows(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	if _, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, effective_from, input_micro, output_micro, created_by)
		VALUES ('gpt-4o', now() - interval '1 hour', 2500000, 10000000, 'test')`); err != nil {
		t.Fatal(err)
	}
	day := func(name, money string) []rule.WindowLimit {
		ws, err := rule.ParseWindows([]rule.WindowJSON{{Name: name, Unit: "day", TimeZone: "Asia/Tokyo", ResetAt: "06:00", Money: &money}})
		if err != nil {
			t.Fatal(err)
		}
		return ws
	}
	l := limits(10_000_000, "1000")
	l.Windows = day("team-daily", "100")
	b.tenant(t, "acme", l)
	tpl := limits(1_000_000, "100")
	tpl.Windows = day("user-daily", "2")
	if _, err := b.store.EndUserPolicySet(ctx, account.EndUserPolicyParams{TenantID: "acme", Source: rule.SourceHeader, Header: "x-end-user",
		Template: tpl, MaxEndUsers: 7, IdleTTL: 2 * time.Hour, Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	alice, err := b.store.EndUserEnsure(ctx, "acme", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Reserve(ctx, account.ReserveParams{TenantID: alice, Estimate: estimator.Estimate{Model: "gpt-4o",
		InputTokens: 100_000, OutputTokens: 20_000, Cost: 120_000, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}); err != nil {
		t.Fatal(err)
	}
	c := b.client(t, "192.0.2.35")
	c.mustLogin()
	page := c.get("/tenants/acme").Body.String()
	section := page[strings.Index(page, `id="windows-section"`):]
	section = section[:strings.Index(section, "</section>")]
	row := func(tenant, window string) string {
		t.Helper()
		i := strings.Index(section, `data-window-tenant="`+tenant+`" data-window="`+window+`"`)
		if i < 0 {
			t.Fatalf("no %s window of %s in:\n%s", window, tenant, section)
		}
		r := section[i:]
		return r[:strings.Index(r, "</tr>")]
	}
	for _, want := range []string{`end user <span class="mono">alice</span>`, "0.45 USD / 2.00 USD", `data-col="spent">0.45 USD<`, "06:00 Asia/Tokyo"} {
		if r := row(alice, "user-daily"); !strings.Contains(r, want) {
			t.Errorf("alice's window lacks %q:\n%s", want, r)
		}
	}
	for _, want := range []string{"0.45 USD / 100.00 USD", `data-col="spent">0.45 USD<`} {
		if r := row("acme", "team-daily"); !strings.Contains(r, want) {
			t.Errorf("acme's window lacks %q:\n%s", want, r)
		}
	}

	// The live JSON each page polls carries the very windows it shows, as
	// it renders them, so that the script can move every row.
	if _, err := b.store.Reserve(ctx, account.ReserveParams{TenantID: alice, Estimate: estimator.Estimate{Model: "gpt-4o",
		InputTokens: 100_000, OutputTokens: 20_000, Cost: 120_000, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}); err != nil {
		t.Fatal(err)
	}
	rowRE := regexp.MustCompile(`data-window-tenant="([^"]+)" data-window="([^"]+)"`)
	for _, pg := range []struct{ page, live string }{{"/tenants/acme", "/ui/overview.json?tenant=acme"}, {"/", "/ui/overview.json"}} {
		var shown []string
		for _, m := range rowRE.FindAllStringSubmatch(c.get(pg.page).Body.String(), -1) {
			shown = append(shown, m[1]+" "+m[2])
		}
		rec := c.get(pg.live)
		var live struct {
			Windows []struct {
				Tenant, Name, Used, Pct, Level, Spent, Resets string
				ResetsAt                                      string `json:"resets_at"`
			} `json:"windows"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &live); err != nil || rec.Code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", pg.live, rec.Code, rec.Body.String())
		}
		var got []string
		for _, w := range live.Windows {
			got = append(got, w.Tenant+" "+w.Name)
			want := map[string][2]string{alice + " user-daily": {"0.90 USD / 2.00 USD", "45.0"}, "acme team-daily": {"0.90 USD / 100.00 USD", "0.9"}}[w.Tenant+" "+w.Name]
			if w.Used != want[0] || w.Pct != want[1] || w.Level != "ok" || w.Spent != "0.90 USD" ||
				!strings.HasSuffix(w.Resets, "06:00 Asia/Tokyo") || !strings.HasSuffix(w.ResetsAt, "T06:00:00+09:00") {
				t.Errorf("%s: window %+v; want used %q, %s %%, 0.90 USD spent, reset 06:00 Tokyo", pg.live, w, want[0], want[1])
			}
		}
		if !slices.Equal(got, shown) || len(got) == 0 {
			t.Errorf("%s carries windows %q; %s shows %q", pg.live, got, pg.page, shown)
		}
	}
}
