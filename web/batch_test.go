package web_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// The batch allowance on the tenant page: none at first, set by its form
// (a bad capacity is refused naming the field, changing nothing), then
// shown with what is free and its models; the change is a limits entry.
func TestBatchAllowanceForm(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.tenant(t, "acme", limits(1000, "1"))
	c := b.client(t, "192.0.2.61")
	c.mustLogin()
	csrf := c.csrf("/")
	if page := c.get("/tenants/acme").Body.String(); !strings.Contains(page, "No batch allowance") {
		t.Fatal("the page does not say the tenant has no batch allowance")
	}
	bad := url.Values{"csrf": {csrf}, "batch_tokens_capacity": {"-5"}}
	if rec := c.post("/tenants/acme/batch-allowance", bad); rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), "batch_tokens_capacity") {
		t.Fatalf("negative capacity: %d", rec.Code)
	}
	if n := b.count(t, `SELECT count(*) FROM batch_allowances`); n != 0 {
		t.Fatalf("a refused form set an allowance (%d rows)", n)
	}
	good := url.Values{"csrf": {csrf}, "batch_tokens_capacity": {"5,000"}}
	if rec := c.post("/tenants/acme/batch-allowance", good); rec.Code != http.StatusSeeOther {
		t.Fatalf("save: %d %s", rec.Code, rec.Body.String())
	}
	page := c.get("/tenants/acme").Body.String()
	if !strings.Contains(page, "5,000 / 5,000") {
		t.Fatal("the page does not show the allowance set")
	}
	if n := b.count(t, `SELECT count(*) FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'limits' AND detail LIKE '%batch_allowance%'`); n != 1 {
		t.Fatalf("%d allowance entries", n)
	}
}
