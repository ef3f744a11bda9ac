package web_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestAdjustFormRefusesDebtFloorAndOverflow: the dashboard's adjustment
// form answers a debit past the debt floor, or an amount out of range,
// with the form again (422) naming tokens, and writes nothing.
func TestAdjustFormRefusesDebtFloorAndOverflow(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.tenant(t, "acme", limits(1000, "1"))
	c := b.client(t, "192.0.2.9")
	c.mustLogin()
	for _, tc := range []struct{ tokens, want string }{
		{"-2001", "debt floor"},
		{"-1000000000001", "out of range"},
	} {
		rec := c.post("/tenants/acme/adjust", url.Values{"tokens": {tc.tokens}, "reason": {"test"}, "csrf": {c.csrf("/tenants/acme")}})
		if rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), tc.want) {
			t.Fatalf("adjust %s: %d, want 422 saying %q", tc.tokens, rec.Code, tc.want)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'adjust'`); n != 0 {
		t.Fatalf("%d adjustments written", n)
	}
}
