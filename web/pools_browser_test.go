package web_test

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
)

// TestBrowserModelLimitsPoolsAndPriority drives, in Chromium, the forms
// for a tenant's model limits, an upstream pool shared by two tenants
// weighted 1:2 and a key's priority class; then real admissions over the
// API, and what the tenant page (model buckets, one spent and one shadow
// that would have refused) and the pools page say about them, exactly. The store's clock is frozen, so no bucket refills between the
// admissions and the assertions: every balance below is exact.
func TestBrowserModelLimitsPoolsAndPriority(t *testing.T) {
	t.Parallel()
	start := time.Now()
	b := setup(t, nil)
	at := time.Now().UTC().Truncate(time.Second)
	b.store.WithClock(func() time.Time { return at }) // before serve: nothing reads it yet
	base := serve(t, b)
	br := startBrowser(t, base)
	keyAcme := b.tenant(t, "acme", limits(1_000_000, "1"))
	keyGlobex := b.tenant(t, "globex", limits(1_000_000, "1"))
	br.login(b.adminSecret)

	texts, flash, errorsOf := br.texts, br.flash, br.formErrors
	limitsEntries := func(id string) []string {
		t.Helper()
		rows, err := b.pool.Query(ctx, `SELECT actor || ' ' || reason || ' ' || coalesce(detail::jsonb->>'after', 'null')
			FROM ledger_entries WHERE tenant_id = $1 AND kind = 'limits' ORDER BY seq`, id)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
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

	// 1. Model limits for acme's gpt-4o through the tenant page's form:
	// input 100 tokens at 2.5/s, output 40 at 10/s as a shadow limit.
	br.navigate("/tenants/acme")
	br.do("set model limits",
		chromedp.SetValue(chromedp.CSS("#ml-model"), "gpt-4o"),
		chromedp.SetValue(chromedp.CSS("#ml-input_tokens_capacity"), "100"),
		chromedp.SetValue(chromedp.CSS("#ml-input_tokens_per_second"), "2.5"),
		chromedp.SetValue(chromedp.CSS("#ml-output_tokens_capacity"), "40"),
		chromedp.SetValue(chromedp.CSS("#ml-output_tokens_per_second"), "10"),
		chromedp.Click(chromedp.CSS("#ml-shadow-output_tokens")),
		submit(`#model-limits-form button[type="submit"]`))
	flash("Model limits saved.")
	modelRows := `Array.from(document.querySelectorAll('#model-limits-section tbody tr')).map(function (tr) {
		if (!tr.dataset.model) { return tr.textContent.trim(); }
		return [tr.dataset.model].concat(Array.from(tr.querySelectorAll('td[data-bucket]')).map(function (td) {
			var rate = td.querySelector('.rate'), fill = td.querySelector('.fill');
			return td.dataset.bucket + ': ' + td.querySelector('.bal').textContent + (td.querySelector('.badge.shadow') ? ' (shadow)' : '') +
				(rate ? ', ' + rate.textContent : '') + ', gauge ' + (fill ? fill.getAttribute('width') : 'none');
		})).join(' | '); })`
	if got := texts(modelRows); !slices.Equal(got, []string{
		"gpt-4o | input: 100 / 100, refills 2.5/s, gauge 100 | output: 40 / 40 (shadow), refills 10/s, gauge 100",
	}) {
		t.Errorf("after setting model limits the rows are %q", got)
	}
	if got := limitsEntries("acme"); !slices.Equal(got, []string{
		`admin:oncall model limits: gpt-4o {"shadow": ["output_tokens"], "input_tokens_capacity": 100, "output_tokens_capacity": 40, "input_tokens_per_second": "2.5", "output_tokens_per_second": "10"}`,
	}) {
		t.Errorf("limits entries after setting model limits: %q", got)
	}
	br.noViolations("tenant page with model limits")

	// A bucket with a capacity and no rate is refused next to the rate,
	// the form comes back as sent, and nothing is saved.
	br.do("set a bucket without its rate",
		chromedp.SetValue(chromedp.CSS("#ml-model"), "gpt-4o-mini"),
		chromedp.SetValue(chromedp.CSS("#ml-input_tokens_capacity"), "50"),
		submit(`#model-limits-form button[type="submit"]`))
	const rateErr = "input_tokens_per_second: input_tokens_capacity and input_tokens_per_second are set together, and the rate is at most 1e9"
	if got := errorsOf("#model-limits-form"); !slices.Equal(got, []string{rateErr, rateErr}) {
		t.Errorf("the refused model limits show %q", got)
	}
	if got := eval[string](br, `document.getElementById('ml-model').value + ' ' + document.getElementById('ml-input_tokens_capacity').value`); got != "gpt-4o-mini 50" {
		t.Errorf("the refused form came back as %q", got)
	}
	if got := limitsEntries("acme"); len(got) != 1 {
		t.Errorf("the refused form wrote limits entries: %q", got)
	}
	if ml, err := b.store.ModelLimitsList(ctx, "acme"); err != nil || len(ml) != 1 || ml[0].Limits.Model != "gpt-4o" {
		t.Fatalf("model limits after the refused form: %+v %v", ml, err)
	}

	// A row's edit link fills the form with its limits.
	br.navigate("/tenants/acme")
	br.do("edit gpt-4o", submit(`#model-limits-section tr[data-model="gpt-4o"] a.edit`))
	if got := eval[string](br, `['model', 'input_tokens_capacity', 'input_tokens_per_second', 'output_tokens_capacity', 'output_tokens_per_second'].map(function (n) {
		return document.getElementById('ml-' + n).value; }).join(' ') + ' ' + Array.from(document.querySelectorAll('#ml-shadow input:checked')).map(function (e) { return e.value; }).join(',')`); got != "gpt-4o 100 2.5 40 10 output_tokens" {
		t.Errorf("the edit link fills the form with %q", got)
	}

	// 2. A pool through the pools page: created, gpt-4o routed to it,
	// acme weighted 1 and globex 2.
	br.navigate("/pools")
	if got := eval[string](br, `document.querySelector('.nav a[aria-current="page"]').textContent`); got != "Pools" {
		t.Errorf("the nav marks %q", got)
	}
	br.do("create a pool",
		chromedp.SetValue(chromedp.CSS("#np-id"), "gpu"),
		chromedp.SetValue(chromedp.CSS("#np-tokens_capacity"), "1000"),
		chromedp.SetValue(chromedp.CSS("#np-tokens_per_second"), "0.5"),
		submit(`#create-pool button[type="submit"]`))
	flash("Pool created")
	br.do("route gpt-4o", chromedp.SetValue(chromedp.CSS("#pool-gpu-route-model"), "gpt-4o"), submit(`#pool-gpu-route button[type="submit"]`))
	flash("Model routed")
	weight := func(tenant, w string) {
		t.Helper()
		br.do("weigh "+tenant,
			chromedp.SetValue(chromedp.CSS("#pool-gpu-weight-tenant"), tenant),
			chromedp.SetValue(chromedp.CSS("#pool-gpu-weight-weight"), w),
			submit(`#pool-gpu-weight button[type="submit"]`))
	}
	weight("acme", "1")
	flash("Weight saved")
	weight("globex", "2")
	flash("Weight saved")
	poolJS := `(function (p) {
		return [p.querySelector('[data-pool-field="tokens"]').textContent, p.querySelector('[data-pool-field="rate"]').textContent,
			'gauge ' + p.querySelector('.gauge .fill').getAttribute('width'),
			'routed: ' + Array.from(p.querySelectorAll('.routed li[data-routed]')).map(function (li) { return li.dataset.routed; }).join(',')
		].concat(Array.from(p.querySelectorAll('.shares tbody tr[data-share]')).map(function (tr) {
			return tr.dataset.share + ' ' + Array.from(tr.querySelectorAll('td')).map(function (td) { return td.textContent; }).join(' '); }));
	})(document.querySelector('[data-pool="gpu"]'))`
	// Columns: weight, share of weights, served, share of served, counter.
	if got := texts(poolJS); !slices.Equal(got, []string{
		"1,000 / 1,000", "refills 0.5/s", "gauge 100", "routed: gpt-4o",
		"acme 1 33.3% 0 — 0", "globex 2 66.7% 0 — 0",
	}) {
		t.Errorf("the pool before any admission: %q", got)
	}

	// A weight of 0 is refused next to the weight; nothing changes.
	weight("globex", "0")
	if got := errorsOf("#pool-gpu-weight"); !slices.Equal(got, []string{"weight: must be between 1 and 1000000", "weight: must be between 1 and 1000000"}) {
		t.Errorf("the refused weight shows %q", got)
	}
	if got := eval[string](br, `document.getElementById('pool-gpu-weight-tenant').value + ' ' + document.getElementById('pool-gpu-weight-weight').value`); got != "globex 0" {
		t.Errorf("the refused weight form came back as %q", got)
	}
	pools, err := b.store.Pools(ctx)
	if err != nil || len(pools) != 1 || len(pools[0].Shares) != 2 || pools[0].Shares[0].Weight != 1 || pools[0].Shares[1].Weight != 2 {
		t.Fatalf("the pool after the refused weight: %+v %v", pools, err)
	}
	br.noViolations("pools page")

	// 3. Real admissions over the API, each 9 input and 51 output tokens:
	// one of acme, two of globex. The pool serves 60 raw tokens to each.
	admit := func(key string) {
		t.Helper()
		code, adm := apiCall(t, base, key, "/v1/admissions",
			`{"model":"gpt-4o","messages":[{"role":"user","content":"Hello!"}],"max_tokens":51}`)
		est, _ := adm["estimate"].(map[string]any)
		if code != http.StatusCreated || est["input_tokens"] != float64(9) || est["output_tokens"] != float64(51) {
			t.Fatalf("admission: %d %v, want 201 with 9 input and 51 output tokens", code, adm)
		}
	}
	admit(keyAcme)
	admit(keyGlobex)
	admit(keyGlobex)

	// The pool's bucket lost 180 tokens; served is 60 : 120, as the
	// weights say. Counters are served / weight, a tenant's first admission
	// lifted to the lowest counter of those active, as the virtual token
	// counter prescribes: acme 0 + 60; globex lifted to acme's 60, + 60/2
	// twice = 120. (Acme's first decision had no such floor: the replica
	// had not learnt the pool yet, so counted acme as backlogged.)
	br.navigate("/pools")
	if got := texts(poolJS); !slices.Equal(got, []string{
		"820 / 1,000", "refills 0.5/s", "gauge 82.0", "routed: gpt-4o",
		"acme 1 33.3% 60 33.3% 60", "globex 2 66.7% 120 66.7% 120",
	}) {
		t.Errorf("the pool after the admissions: %q", got)
	}

	// The pool's limits form: a larger bucket keeps the balance.
	br.do("raise the pool's capacity",
		chromedp.SetValue(chromedp.CSS("#pool-gpu-lim-tokens_capacity"), "2000"),
		submit(`#pool-gpu-limits button[type="submit"]`))
	flash("Pool limits saved")
	if got := texts(poolJS)[:3]; !slices.Equal(got, []string{"820 / 2,000", "refills 0.5/s", "gauge 41.0"}) {
		t.Errorf("the pool after raising its capacity: %q", got)
	}

	// acme's gpt-4o buckets: 9 of 100 input tokens spent; the 51 output
	// tokens exceed the shadow output bucket's 40, so it would have
	// refused the admission: counted, and nothing taken from it.
	if err := b.rejections.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	br.navigate("/tenants/acme")
	if got := texts(modelRows); !slices.Equal(got, []string{
		"gpt-4o | input: 91 / 100, refills 2.5/s, gauge 91.0 | output: 40 / 40 (shadow), refills 10/s, gauge 100",
	}) {
		t.Errorf("acme's model limits after the admission: %q", got)
	}
	if got := eval[string](br, `document.querySelector('#tenant .stat .v[data-field="would_refuse"]').textContent`); got != "output_tokens: 1" {
		t.Errorf("acme would have refused %q", got)
	}

	// 4. A key's priority class, changed with its select.
	keys, err := credential.KeyList(ctx, b.pool, "acme")
	if err != nil || len(keys) != 1 {
		t.Fatalf("acme's keys: %v %v", keys, err)
	}
	keyRow := `#keys-section tr[data-key="` + keys[0].ID + `"]`
	priority := func() string {
		t.Helper()
		return eval[string](br, `document.querySelector('`+keyRow+` .badge.prio').textContent + ' ' + document.querySelector('`+keyRow+` select[name="priority"]').value`)
	}
	if got := priority(); got != "standard standard" {
		t.Errorf("a new key's priority shows %q", got)
	}
	br.do("make the key critical", chromedp.SetValue(chromedp.CSS(keyRow+` select[name="priority"]`), "critical"), submit(keyRow+` form.priority button`))
	flash("Key priority changed")
	if got := priority(); got != "critical critical" {
		t.Errorf("after the change the key shows %q", got)
	}
	if n := b.count(t, `SELECT count(*) FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'tenant' AND actor = 'admin:oncall' AND reason = $1`,
		"key priority critical: "+keys[0].ID); n != 1 {
		t.Errorf("%d ledger entries for the priority change, want 1", n)
	}
	// The tenant's recent entries, newest first: the change, then its creation.
	if got := texts(`Array.from(document.querySelectorAll('#entries-section tr.kind-tenant')).map(function (tr) {
		return tr.querySelector('td:nth-last-child(2)').textContent + ' ' + tr.querySelector('td.reason').textContent; })`); !slices.Equal(got, []string{
		"admin:oncall key priority critical: " + keys[0].ID, "test created"}) {
		t.Errorf("the recent tenant entries show %q", got)
	}
	if keys, err := credential.KeyList(ctx, b.pool, "acme"); err != nil || keys[0].Priority != string(rule.PriorityCritical) {
		t.Errorf("the key after the change: %+v %v", keys, err)
	}

	// 5. Removing the model limits removes the row, with a limits entry.
	eval[bool](br, `window.confirm = function () { return true; }; true`)
	br.do("remove gpt-4o's limits", submit(`#model-limits-section tr[data-model="gpt-4o"] form.remove button`))
	flash("Model limits removed")
	if got := texts(modelRows); !slices.Equal(got, []string{"No model limits: every model is limited by the tenant-wide limits only."}) {
		t.Errorf("after removing the model limits the rows are %q", got)
	}
	if got := limitsEntries("acme"); len(got) != 2 || got[1] != "admin:oncall model limits: gpt-4o null" {
		t.Errorf("limits entries after removing: %q", got)
	}
	if ml, err := b.store.ModelLimitsList(ctx, "acme"); err != nil || len(ml) != 0 {
		t.Errorf("model limits after removing: %+v %v", ml, err)
	}
	br.noViolations("tenant page at the end")

	// 6. Unrouting the model takes it off the pool; at a phone's width
	// the page does not scroll sideways.
	br.navigate("/pools")
	eval[bool](br, `window.confirm = function () { return true; }; true`)
	br.do("unroute gpt-4o", submit(`[data-pool="gpu"] li[data-routed="gpt-4o"] form.unroute button`))
	flash("Model unrouted")
	if got := texts(poolJS)[3]; got != "routed: " {
		t.Errorf("after unrouting: %q", got)
	}
	if pools, err := b.store.Pools(ctx); err != nil || len(pools[0].Models) != 0 {
		t.Errorf("the pool's models after unrouting: %+v %v", pools, err)
	}
	br.do("phone width", chromedp.EmulateViewport(390, 844))
	br.navigate("/pools")
	if sizes := eval[[]int](br, `[document.documentElement.scrollWidth, window.innerWidth]`); sizes[0] > sizes[1] {
		t.Errorf("phone: the pools page is %d px wide in %d", sizes[0], sizes[1])
	}
	br.noViolations("pools page at the end")
	t.Logf("pools scenario took %s", time.Since(start).Round(time.Millisecond))
}
