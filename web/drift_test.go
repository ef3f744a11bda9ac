package web_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/ledger/ledgertest"
)

// TestReconciliationOnTenantAndModelsPages: the drift report appears as a
// chart and a table on the tenant page (its own models) and the models page
// (every tenant).
func TestReconciliationOnTenantAndModelsPages(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	key := b.tenant(t, "acme", limits(100_000, "1"))
	rec := b.admit(t, key, 100)
	var a struct{ ID string }
	if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil || rec.Code != http.StatusCreated {
		t.Fatalf("admit: %d %s", rec.Code, rec.Body)
	}
	// Estimate 9 + 100 = 109; actual 9 + 41 = 50: +118.0 % error.
	if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: a.ID, InputTokens: 9, OutputTokens: 41}); err != nil {
		t.Fatal(err)
	}
	c := b.client(t, "192.0.2.50")
	c.mustLogin()
	for _, path := range []string{"/tenants/acme", "/models"} {
		page := c.get(path)
		body := page.Body.String()
		if page.Code != http.StatusOK || !strings.Contains(body, `id="drift-section"`) || !strings.Contains(body, `class="chart drift"`) {
			t.Fatalf("%s: %d, no reconciliation section", path, page.Code)
		}
		if !strings.Contains(body, "&#43;118.0%") || !strings.Contains(body, ">gpt-4o<") { // html/template writes + as &#43;
			t.Fatalf("%s lacks the gpt-4o row with +118.0%% mean error", path)
		}
	}
}

// TestPagesAfterAWrappedBalance: after a history whose sums leave int64
// (a balance that wrapped, as issue 21 found), the tenant page and the
// models page answer 200 with the report's exact sums, where they used to
// answer 500.
func TestPagesAfterAWrappedBalance(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.tenant(t, "acme", limits(1000, "1"))
	w := ledgertest.Wrap(t, b.pool, "acme", "gpt-4o")
	// 5 × (2e12 - 1) tokens charged extra: 9,999,999,999,995 tokens, in
	// micro-tokens beyond int64.
	extra := "9,999,999,999,995"
	if w.ExtraChargedMicro.String() != "9999999999995000000" {
		t.Fatalf("the wrapped history charged %s", w.ExtraChargedMicro)
	}
	c := b.client(t, "192.0.2.51")
	c.mustLogin()
	for _, path := range []string{"/tenants/acme", "/models", "/ledger?tenant=acme", "/"} {
		page := c.get(path)
		if page.Code != http.StatusOK {
			t.Fatalf("%s: %d", path, page.Code)
		}
		body := page.Body.String()
		if strings.HasPrefix(path, "/tenants/") || path == "/models" {
			if !strings.Contains(body, `data-col="extra_charged">`+extra+`<`) || !strings.Contains(body, ">5,000,000,000<") {
				t.Fatalf("%s lacks the exact sums (extra charged %s, actual input 5,000,000,000)", path, extra)
			}
		}
		if path == "/tenants/acme" && !strings.Contains(body, "Reserved 5 for 10,000,000,000,000 used") {
			t.Fatalf("%s: the cost chart's sums are not exact", path)
		}
	}
}
