package web_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
)

// TestBrowserTreeAndShadowLimits drives the dashboard through a budget
// tree in Chromium: an organisation, a team and a key-level tenant made
// with the create form (the key-level one with a shadow token limit),
// real admissions over the API that the shadow limit would have refused,
// then what the overview, the tenant pages and the reconciliation tables
// say about them, exactly; and a shadow limit turned off and on with the
// limits form, each change a limits entry in the ledger.
func TestBrowserTreeAndShadowLimits(t *testing.T) {
	t.Parallel()
	start := time.Now()
	b := setup(t, nil)
	base := serve(t, b)
	br := startBrowser(t, base)
	const (
		org, team, bot = "acme", "acme.search", "acme.search.bot"
		rate           = "0.000001" // no refill to speak of: the balances below are exact
	)
	b.tenant(t, "zeta", limits(5000, "1")) // a root of its own, listed after acme's tree
	br.login(b.adminSecret)

	// 1. The tree, made with the create form: the tenant page's "nest a
	// tenant" link preselects the parent.
	create := func(id, parent, capacity string, shadow ...string) {
		t.Helper()
		if parent == "" {
			br.navigate("/")
		} else {
			br.navigate("/tenants/" + parent)
			br.do("follow the nest link", chromedp.Click(chromedp.CSS("#nest")), chromedp.WaitVisible(chromedp.CSS("#create-tenant")))
			if got := eval[string](br, `document.getElementById('new-parent').value`); got != parent {
				t.Fatalf("the nest link of %s preselects parent %q", parent, got)
			}
		}
		actions := []chromedp.Action[chromedp.Void]{
			chromedp.SetValue(chromedp.CSS("#new-id"), id),
			chromedp.SetValue(chromedp.CSS("#new-tokens_capacity"), capacity),
			chromedp.SetValue(chromedp.CSS("#new-tokens_per_second"), rate),
		}
		for _, l := range shadow {
			actions = append(actions, chromedp.Click(chromedp.CSS("#new-shadow-"+l)))
		}
		actions = append(actions, submit(`#create-tenant button[type="submit"]`),
			chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#tenant[data-tenant=%q]`, id))))
		br.do("create "+id, actions...)
		br.noViolations("tenant page of " + id)
	}
	create(org, "", "1000000")
	create(team, org, "100000")
	create(bot, team, "100", "tokens")
	for id, want := range map[string][]string{org: {}, team: {org}, bot: {org, team}} {
		s, err := b.store.TenantSnapshot(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(s.Path, want) || (id == bot) != (s.Limits.Shadow == rule.LimitSet(0).With(rule.LimitTokens)) {
			t.Fatalf("%s: path %q, shadow %v", id, s.Path, s.Limits.Shadow.Strings())
		}
	}

	// A parent that does not exist comes back as the form's error, the
	// form as it was sent.
	br.navigate("/")
	br.do("create under a missing parent",
		chromedp.SetValue(chromedp.CSS("#new-id"), "orphan"),
		chromedp.SetValue(chromedp.CSS("#new-tokens_capacity"), "10"),
		chromedp.SetValue(chromedp.CSS("#new-tokens_per_second"), "1"),
	)
	eval[bool](br, `(function (s) { s.add(new Option('ghost', 'ghost', true, true)); return true; })(document.getElementById('new-parent'))`)
	br.do("submit", submit(`#create-tenant button[type="submit"]`), chromedp.WaitVisible(chromedp.CSS("#create-tenant .form-errors")))
	if got := eval[[]string](br, `Array.from(document.querySelectorAll('#create-tenant .form-errors li, #create-tenant .field-error')).map(function (e) { return e.textContent; })`); !slices.Equal(got, []string{
		`parent: no tenant has the id "ghost"`, `parent: no tenant has the id "ghost"`,
	}) {
		t.Fatalf("a missing parent shows %q", got)
	}
	if got := eval[string](br, `document.getElementById('new-parent').value + ' ' + document.getElementById('new-id').value`); got != "ghost orphan" {
		t.Errorf("the refused form came back as %q", got)
	}
	if n := b.count(t, `SELECT count(*) FROM tenants`); n != 4 {
		t.Fatalf("%d tenants after the refused form, want 4", n)
	}

	// 2. Three admissions of cost 60 over the API: bot's 100 tokens fit the
	// first; its shadow limit would have refused the other two, which go
	// through and, at bot's level only, debit nothing.
	_, key, err := credential.KeyCreate(ctx, b.pool, bot)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		code, adm := apiCall(t, base, key, "/v1/admissions",
			`{"model":"gpt-4o","messages":[{"role":"user","content":"Hello!"}],"max_tokens":51}`)
		est, _ := adm["estimate"].(map[string]any)
		if code != http.StatusCreated || est["cost"] != float64(60) {
			t.Fatalf("admission %d: %d %v, want 201 costing 60", i, code, adm)
		}
	}
	if err := b.rejections.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	// 3. The overview: each tenant under its parent, indented, with what
	// its shadow limits would have refused.
	br.navigate("/")
	type row struct {
		ID, Depth, Parent, Tokens, Would string
		Shadow                           int
		Left                             float64
	}
	rowsJS := `Array.from(document.querySelectorAll('tbody[data-live-sort] tr')).map(function (tr) { return {
		ID: tr.dataset.tenant, Depth: tr.dataset.depth, Parent: tr.dataset.parent || '',
		Tokens: tr.querySelector('[data-field="tokens"]').textContent,
		Would: tr.querySelector('[data-field="would_refuse"]').textContent,
		Shadow: tr.querySelectorAll('.badge.shadow').length,
		Left: tr.querySelector('th a').getBoundingClientRect().left }; })`
	wantRows := []row{
		{ID: org, Depth: "0", Tokens: "999,820 / 1,000,000", Would: "—"},
		{ID: team, Depth: "1", Parent: org, Tokens: "99,820 / 100,000", Would: "—"},
		{ID: bot, Depth: "2", Parent: team, Tokens: "40 / 100", Would: "tokens: 2", Shadow: 1},
		{ID: "zeta", Depth: "0", Tokens: "5,000 / 5,000", Would: "—"},
	}
	checkOverview := func(when string) {
		t.Helper()
		got := eval[[]row](br, rowsJS)
		if len(got) != len(wantRows) {
			t.Fatalf("%s: the overview lists %+v", when, got)
		}
		for i, w := range wantRows {
			g := got[i]
			w.Left = g.Left
			if g != w {
				t.Errorf("%s: row %d is %+v, want %+v", when, i, g, w)
			}
		}
		if !(got[0].Left < got[1].Left && got[1].Left < got[2].Left && got[3].Left == got[0].Left) {
			t.Errorf("%s: names start at %v px: the team is not indented under acme, or the key tenant under the team", when,
				[]float64{got[0].Left, got[1].Left, got[2].Left, got[3].Left})
		}
		if h := eval[[]string](br, `Array.from(document.querySelectorAll('table.tenants thead th')).map(function (e) { return e.textContent; })`); h[len(h)-1] != "Would have refused" {
			t.Errorf("%s: the last column is %q", when, h[len(h)-1])
		}
	}
	checkOverview("the overview")
	br.waitFor("the live script's first answer", `document.getElementById('live-status').textContent.startsWith('live ·')`, 10*time.Second)
	checkOverview("the overview after a live update")
	br.noViolations("overview")

	// At a phone's width the rows are cards, still indented.
	br.do("phone width", chromedp.EmulateViewport(390, 844))
	br.navigate("/")
	lefts := eval[[]float64](br, `Array.from(document.querySelectorAll('tbody[data-live-sort] tr')).map(function (tr) { return tr.getBoundingClientRect().left; })`)
	sizes := eval[[]int](br, `[document.documentElement.scrollWidth, window.innerWidth]`)
	if len(lefts) != 4 || !(lefts[0] < lefts[1] && lefts[1] < lefts[2] && lefts[3] == lefts[0]) || sizes[0] > sizes[1] {
		t.Errorf("phone: card lefts %v, scroll width %d of %d", lefts, sizes[0], sizes[1])
	}
	br.do("desktop width", chromedp.EmulateViewport(1280, 800))

	// 4. The team's page: its place in the tree, its child with gauges.
	br.navigate("/")
	br.do("open the team", submit(fmt.Sprintf(`tr[data-tenant=%q] th a`, team)), chromedp.WaitVisible(chromedp.CSS("#tree-section")))
	if p := br.path(); p != "/tenants/"+team {
		t.Fatalf("the team's link leads to %s", p)
	}
	if got := eval[string](br, `document.getElementById('crumbs').textContent`); got != "Tenants / acme / acme.search" {
		t.Errorf("breadcrumb %q", got)
	}
	if got := eval[[]string](br, `Array.from(document.querySelectorAll('#crumbs a')).map(function (a) { return a.getAttribute('href'); })`); !slices.Equal(got, []string{"/", "/tenants/acme"}) {
		t.Errorf("breadcrumb links %q", got)
	}
	if got := eval[string](br, `document.getElementById('levels').textContent`); got != "An admission must fit every level. One of acme.search must fit the limits of acme, then acme.search; "+
		"the first level it does not fit refuses it, and the refusal names that level. Every admission of the tenants nested below it (1 directly) must fit its limits too." {
		t.Errorf("the levels say %q", got)
	}
	treeJS := `Array.from(document.querySelectorAll('#tree-section tbody tr')).map(function (tr) {
		return [tr.dataset.tenant, tr.dataset.depth, tr.hasAttribute('data-current') ? 'current' : '',
			tr.querySelector('[data-field="tokens"]').textContent, tr.querySelector('[data-field="would_refuse"]').textContent,
			String(tr.querySelectorAll('[data-gauge]').length)].join('|'); })`
	if got := eval[[]string](br, treeJS); !slices.Equal(got, []string{
		"acme|0||999,820 / 1,000,000|—|1", "acme.search|1|current|99,820 / 100,000|—|1", "acme.search.bot|2||40 / 100|tokens: 2|1",
	}) {
		t.Errorf("the team's tree shows %q", got)
	}
	if got := eval[string](br, `document.querySelector('#tree-section tr[data-tenant="acme.search.bot"] [data-gauge="tokens"] .fill').getAttribute('width')`); got != "40.0" {
		t.Errorf("the child's tokens gauge is %q wide, want 40.0", got)
	}
	// Its ancestor in the breadcrumb leads to the organisation's page.
	br.do("open the organisation", submit(`#crumbs a[data-crumb="acme"]`), chromedp.WaitVisible(chromedp.CSS(`#tenant[data-tenant="acme"]`)))
	if got := eval[string](br, `document.getElementById('crumbs').textContent`); got != "Tenants / acme" {
		t.Errorf("the organisation's breadcrumb %q", got)
	}
	if got := eval[string](br, `document.getElementById('levels').textContent`); got != "An admission must fit every level. acme has no parent, so its own limits decide its admissions. "+
		"Every admission of the tenants nested below it (1 directly) must fit its limits too." {
		t.Errorf("the organisation's levels say %q", got)
	}

	// 5. The key-level tenant's page: the shadow limit, what it would have
	// refused, and the reconciliation's shadow column.
	br.navigate("/tenants/" + bot)
	botPage := func(when, shadowNow string, checked []string) {
		t.Helper()
		if got := eval[string](br, `document.getElementById('shadow-now').textContent`); got != shadowNow {
			t.Errorf("%s: the limits say %q, want %q", when, got, shadowNow)
		}
		if got := eval[[]string](br, `Array.from(document.querySelectorAll('#limits input[name="shadow"]:checked')).map(function (e) { return e.value; })`); !slices.Equal(got, checked) {
			t.Errorf("%s: shadow boxes ticked %q, want %q", when, got, checked)
		}
		if got := eval[[]string](br, `Array.from(document.querySelectorAll('#limits input[name="shadow"]')).map(function (e) { return e.value; })`); !slices.Equal(got, []string{"tokens", "requests", "concurrency", "period_budget"}) {
			t.Errorf("%s: shadow boxes %q", when, got)
		}
	}
	botPage("bot's page", "Shadow limits (counted, not enforced): tokens.", []string{"tokens"})
	if got := eval[string](br, `document.querySelector('#tenant .stat .v[data-field="would_refuse"]').textContent + ' | ' +
		Array.from(document.querySelectorAll('#tenant .stat h3 .badge.shadow')).map(function (e) { return e.parentNode.firstChild.textContent.trim(); }).join(',')`); got != "tokens: 2 | Tokens" {
		t.Errorf("bot's stats: %q", got)
	}
	drift := `Array.from(document.querySelectorAll('#drift-section tr[data-drift-model="gpt-4o"] td')).map(function (e) { return e.textContent; })`
	driftHead := `Array.from(document.querySelectorAll('#drift-section thead th')).map(function (e) { return e.textContent; })`
	checkDrift := func(where string) {
		t.Helper()
		head, cells := eval[[]string](br, driftHead), eval[[]string](br, drift)
		i := slices.Index(head, "Shadow refused")
		if i < 1 || len(cells) != len(head)-1 || cells[0] != "3" || cells[i-1] != "2" {
			t.Errorf("%s: reconciliation %q / %q, want 3 admissions of which 2 shadow refused", where, head, cells)
		}
	}
	checkDrift("bot's page")
	br.navigate("/models")
	checkDrift("the models page")
	br.navigate("/tenants/" + team)
	if cells := eval[[]string](br, drift); len(cells) != 0 {
		t.Errorf("the team's reconciliation lists its child's admissions: %q", cells)
	}

	// 6. Shadow limits through the limits form. A shadow limit that is
	// not configured is refused next to the boxes, and nothing is saved.
	limitsEntries := func(id string) []string {
		t.Helper()
		rows, err := b.pool.Query(ctx, `SELECT actor || ' ' || coalesce(detail::jsonb->'before'->>'shadow', '-') || ' -> ' || coalesce(detail::jsonb->'after'->>'shadow', '-')
			FROM ledger_entries WHERE tenant_id = $1 AND kind = 'limits' ORDER BY seq`, id)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		return out
	}
	br.navigate("/tenants/" + bot)
	br.do("make an unconfigured limit shadow", chromedp.Click(chromedp.CSS("#lim-shadow-requests")), submit(`#limits button[type="submit"]`),
		chromedp.WaitVisible(chromedp.CSS("#limits .form-errors")))
	if got := eval[[]string](br, `Array.from(document.querySelectorAll('#limits .form-errors li, #lim-shadow .field-error')).map(function (e) { return e.textContent; })`); !slices.Equal(got, []string{
		"shadow: requests is not configured, so it cannot be a shadow limit", "shadow: requests is not configured, so it cannot be a shadow limit",
	}) {
		t.Errorf("the refused shadow limit shows %q", got)
	}
	botPage("the refused form", "Shadow limits (counted, not enforced): tokens.", []string{"tokens", "requests"})
	if got := limitsEntries(bot); len(got) != 0 {
		t.Fatalf("the refused form wrote limits entries %q", got)
	}

	// Turning the shadow limit off is a limits entry, before and after.
	br.navigate("/tenants/" + bot)
	br.do("turn the shadow limit off", chromedp.Click(chromedp.CSS("#lim-shadow-tokens")), submit(`#limits button[type="submit"]`))
	if flash := eval[string](br, `document.querySelector('.flash').textContent`); !strings.Contains(flash, "Limits saved") {
		t.Fatalf("after saving limits the page says %q", flash)
	}
	botPage("after turning it off", "Every configured limit is enforced.", nil)
	if got := limitsEntries(bot); !slices.Equal(got, []string{`admin:oncall ["tokens"] -> -`}) {
		t.Errorf("limits entries after turning it off: %q", got)
	}
	if got := eval[[]string](br, `Array.from(document.querySelectorAll('#entries-section tr.kind-limits td:nth-last-child(2)')).map(function (e) { return e.textContent; })`); !slices.Equal(got, []string{"admin:oncall"}) {
		t.Errorf("the tenant's recent entries show limits entries by %q", got)
	}
	if s, err := b.store.TenantSnapshot(ctx, bot); err != nil || s.Limits.Shadow != 0 || s.Limits.TokensCapacity != 100 {
		t.Fatalf("bot after the form: %+v %v", s.Limits, err)
	}
	// Now enforced: bot's 40 tokens refuse a request costing 60.
	if code, body := apiCall(t, base, key, "/v1/admissions",
		`{"model":"gpt-4o","messages":[{"role":"user","content":"Hello!"}],"max_tokens":51}`); code != http.StatusTooManyRequests {
		raw, _ := json.Marshal(body)
		t.Errorf("an admission past the now enforced limit: %d %s", code, raw)
	}

	// And on again, on the team this time.
	br.navigate("/tenants/" + team)
	br.do("make the team's tokens shadow", chromedp.Click(chromedp.CSS("#lim-shadow-tokens")), submit(`#limits button[type="submit"]`))
	if got := limitsEntries(team); !slices.Equal(got, []string{`admin:oncall - -> ["tokens"]`}) {
		t.Errorf("the team's limits entries: %q", got)
	}
	if got := eval[string](br, `document.getElementById('shadow-now').textContent`); got != "Shadow limits (counted, not enforced): tokens." {
		t.Errorf("the team's limits say %q", got)
	}
	br.navigate("/")
	if got := eval[[]string](br, `Array.from(document.querySelectorAll('tbody[data-live-sort] tr')).map(function (tr) { return tr.dataset.tenant + ':' + tr.querySelectorAll('.badge.shadow').length; })`); !slices.Equal(got, []string{
		"acme:0", "acme.search:1", "acme.search.bot:0", "zeta:0",
	}) {
		t.Errorf("shadow badges on the overview: %q", got)
	}
	br.noViolations("overview at the end")
	t.Logf("tree scenario took %s", time.Since(start).Round(time.Millisecond))
}
