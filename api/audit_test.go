package api_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/ledger/ledgertest"
)

func TestTenantReadsOnlyItsOwnLedger(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	acme := b.tenant(t, "acme", lim(10_000, "1"))
	globex := b.tenant(t, "globex", lim(10_000, "1"))
	b.call(t, acme, http.MethodPost, "/v1/admissions", chat(10, "x"))
	b.call(t, globex, http.MethodPost, "/v1/admissions", chat(10, "x"))

	var page struct {
		Entries []struct {
			TenantID string `json:"tenant_id"`
			Kind     string `json:"kind"`
		} `json:"entries"`
	}
	res := b.call(t, acme, http.MethodGet, "/v1/ledger", "")
	res.json(&page)
	if res.Code != 200 || len(page.Entries) != 2 || res.Header().Get("X-RateLimit-Limit-Tokens") == "" {
		t.Fatalf("own ledger: %d %s", res.Code, res.Body)
	}
	for _, e := range page.Entries {
		if e.TenantID != "acme" {
			t.Fatalf("acme sees %s's entry", e.TenantID)
		}
	}
	if r := b.call(t, acme, http.MethodGet, "/v1/ledger?tenant=globex", ""); r.Code != http.StatusBadRequest {
		t.Fatalf("asking for another tenant: %d", r.Code)
	}
	r := b.call(t, acme, http.MethodGet, "/v1/ledger?format=ndjson", "")
	lines := strings.Split(strings.TrimSpace(r.Body.String()), "\n")
	if r.Code != 200 || len(lines) != 2 || strings.Contains(r.Body.String(), "globex") || !strings.HasPrefix(r.Header().Get("Content-Type"), "application/x-ndjson") {
		t.Fatalf("ndjson export: %d %s", r.Code, r.Body)
	}
	if r := b.call(t, "", http.MethodGet, "/v1/ledger", ""); r.Code != http.StatusUnauthorized {
		t.Fatalf("no key: %d", r.Code)
	}
}

func TestAdminVerifyAndDriftReport(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "auditor")
	key := b.tenant(t, "acme", lim(10_000, "1"))
	var a admitted
	b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "x")).json(&a)
	b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/settle", `{"usage":{"prompt_tokens":8,"completion_tokens":42}}`)

	var v struct {
		OK      bool `json:"ok"`
		Tenants []struct {
			TenantID  string `json:"tenant_id"`
			OK        bool   `json:"ok"`
			Entries   int64  `json:"entries"`
			BrokenSeq int64  `json:"broken_seq"`
			Problem   string `json:"problem"`
		} `json:"tenants"`
	}
	b.adminCall(t, token, http.MethodGet, "/v1/admin/ledger/verify", nil).json(&v)
	if !v.OK || len(v.Tenants) != 1 || v.Tenants[0].Entries != 3 {
		t.Fatalf("verify: %+v", v)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE tenants SET tokens_micro = tokens_micro + 1 WHERE id = 'acme'`); err != nil {
		t.Fatal(err)
	}
	b.adminCall(t, token, http.MethodGet, "/v1/admin/ledger/verify?tenant=acme", nil).json(&v)
	if v.OK || v.Tenants[0].OK || v.Tenants[0].BrokenSeq != 3 || !strings.Contains(v.Tenants[0].Problem, "outside the ledger") {
		t.Fatalf("verify after tampering: %+v", v)
	}
	if r := b.adminCall(t, token, http.MethodGet, "/v1/admin/ledger/verify?tenant=nobody", nil); r.Code != http.StatusNotFound {
		t.Fatalf("unknown tenant: %d", r.Code)
	}

	var rep struct {
		Rows []struct {
			TenantID      string `json:"tenant_id"`
			Model         string `json:"model"`
			Admissions    int64  `json:"admissions"`
			EstimatedCost int64  `json:"estimated_cost"`
			ActualCost    int64  `json:"actual_cost"`
			Refunded      int64  `json:"refunded_micro"`
		} `json:"rows"`
	}
	r := b.adminCall(t, token, http.MethodGet, "/v1/admin/reports/drift?tenant=acme", nil)
	r.json(&rep)
	if r.Code != 200 || len(rep.Rows) != 1 || rep.Rows[0].EstimatedCost != 108 || rep.Rows[0].ActualCost != 50 || rep.Rows[0].Refunded != 58_000_000 {
		t.Fatalf("drift: %d %s", r.Code, r.Body)
	}

	// NDJSON export of the admin ledger: one JSON object per line.
	r = b.adminCall(t, token, http.MethodGet, "/v1/admin/ledger/export?format=ndjson", nil)
	sc := bufio.NewScanner(strings.NewReader(r.Body.String()))
	n := 0
	for sc.Scan() {
		var e map[string]any
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e["hash"] == "" {
			t.Fatalf("line %d: %s (%v)", n, sc.Text(), err)
		}
		n++
	}
	if n != 3 {
		t.Fatalf("%d ndjson lines", n)
	}
	if r := b.adminCall(t, token, http.MethodGet, "/v1/admin/ledger/export?format=xml", nil); r.Code != 400 {
		t.Fatalf("bad format: %d", r.Code)
	}
}

// TestDriftReportAndVerifyAfterAWrappedBalance: after a history whose
// balance wrapped past int64 (issue 21), the drift report answers 200 with
// exact sums, JSON numbers beyond int64, where it answered 500; verify
// names the entry that overflowed, with kind overflow.
func TestDriftReportAndVerifyAfterAWrappedBalance(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "auditor")
	b.tenant(t, "acme", lim(1000, "1"))
	w := ledgertest.Wrap(t, b.pool, "acme", "gpt-4o")

	for _, path := range []string{"/v1/admin/reports/drift?tenant=acme", "/v1/admin/reports/drift?by=model"} {
		r := b.adminCall(t, token, http.MethodGet, path, nil)
		if r.Code != http.StatusOK {
			t.Fatalf("%s: %d %s", path, r.Code, r.Body)
		}
		var rep struct {
			Rows []map[string]any `json:"rows"`
		}
		dec := json.NewDecoder(bytes.NewReader(r.Body.Bytes()))
		dec.UseNumber() // every digit, as a client of big sums must
		if err := dec.Decode(&rep); err != nil || len(rep.Rows) != 1 {
			t.Fatalf("%s: %s (%v)", path, r.Body, err)
		}
		got := rep.Rows[0]
		for field, want := range map[string]string{
			"extra_charged_micro": w.ExtraChargedMicro.String(), "actual_cost": w.ActualCost.String(),
			"actual_input_tokens": w.ActualInput.String(), "refunded_micro": "0", "admissions": "5",
		} {
			if n, ok := got[field].(json.Number); !ok || n.String() != want {
				t.Errorf("%s: %s = %q, want %s", path, field, got[field], want)
			}
		}
	}

	var v struct {
		OK      bool `json:"ok"`
		Tenants []struct {
			OK        bool   `json:"ok"`
			BrokenSeq int64  `json:"broken_seq"`
			Kind      string `json:"kind"`
		} `json:"tenants"`
	}
	b.adminCall(t, token, http.MethodGet, "/v1/admin/ledger/verify?tenant=acme", nil).json(&v)
	if v.OK || len(v.Tenants) != 1 || v.Tenants[0].Kind != "overflow" || v.Tenants[0].BrokenSeq != w.OverflowSeq {
		t.Fatalf("verify of a wrapped balance: %+v, want an overflow at entry %d", v, w.OverflowSeq)
	}
}
