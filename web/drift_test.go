package web_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget"
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
	if _, err := b.store.Settle(ctx, budget.SettleParams{TenantID: "acme", AdmissionID: a.ID, InputTokens: 9, OutputTokens: 41}); err != nil {
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
