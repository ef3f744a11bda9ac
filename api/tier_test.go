package api_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
)

// TestAdminPriceTiers: a price is added for a service tier (default when
// none is named) and listed by tier; an unknown tier is a 400 naming
// service_tier that stores nothing, in the body and in the query.
func TestAdminPriceTiers(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "ops")
	var p struct {
		Model       string      `json:"model"`
		ServiceTier string      `json:"service_tier"`
		Input       json.Number `json:"input"`
	}
	for _, tc := range []struct{ body, tier string }{
		{`{"model":"gpt-4o","input":"2.50","output":"10"}`, "default"},
		{`{"model":"gpt-4o","service_tier":"flex","input":"1.25","output":"5"}`, "flex"},
		{`{"model":"gpt-4o","service_tier":"priority","input":"5","output":"20"}`, "priority"},
	} {
		r := b.adminCall(t, token, http.MethodPost, "/v1/admin/prices", tc.body)
		r.json(&p)
		if r.Code != http.StatusCreated || p.ServiceTier != tc.tier {
			t.Fatalf("%s: %d %s", tc.body, r.Code, r.Body)
		}
	}
	for _, bad := range []string{
		`{"model":"gpt-4o","service_tier":"scale","input":"1","output":"1"}`,
		`{"model":"gpt-4o","service_tier":"","input":"1","output":"1"}`,
		`{"model":"gpt-4o","service_tier":"FLEX","input":"1","output":"1"}`,
		`{"model":"gpt-4o","service_tier":2,"input":"1","output":"1"}`,
	} {
		if r := b.adminCall(t, token, http.MethodPost, "/v1/admin/prices", bad); r.Code != http.StatusBadRequest || r.errorBody().Error.Field != "service_tier" {
			t.Errorf("%s: %d %s, want 400 naming service_tier", bad, r.Code, r.Body)
		}
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM model_prices`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d rows (%v) after refused tiers, want 3", n, err)
	}
	var list struct {
		Prices []struct {
			ServiceTier string      `json:"service_tier"`
			Input       json.Number `json:"input"`
		} `json:"prices"`
	}
	b.adminCall(t, token, http.MethodGet, "/v1/admin/prices", nil).json(&list)
	if len(list.Prices) != 3 {
		t.Fatalf("every tier: %+v", list)
	}
	b.adminCall(t, token, http.MethodGet, "/v1/admin/prices?service_tier=flex", nil).json(&list)
	if len(list.Prices) != 1 || list.Prices[0].ServiceTier != "flex" || list.Prices[0].Input != "1.25" {
		t.Fatalf("flex: %+v", list)
	}
	if r := b.adminCall(t, token, http.MethodGet, "/v1/admin/prices?service_tier=turbo", nil); r.Code != http.StatusBadRequest || r.errorBody().Error.Field != "service_tier" {
		t.Fatalf("list of an unknown tier: %d %s", r.Code, r.Body)
	}
}

// TestSettleServiceTier: POST /v1/admissions with service_tier flex is
// reserved at the flex price; a settle whose usage says service_tier
// priority is charged at the priority price; an unknown tier is a 400
// naming usage.service_tier that leaves the admission reserved.
func TestSettleServiceTier(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	for _, row := range []string{
		`('gpt-4o', 'default', 2500000, 10000000)`, `('gpt-4o', 'flex', 1250000, 5000000)`, `('gpt-4o', 'priority', 5000000, 20000000)`,
	} {
		if _, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, service_tier, input_micro, output_micro, effective_from, created_by)
			SELECT m, t, i, o, now() - interval '1 hour', 'test' FROM (VALUES `+row+`) v (m, t, i, o)`); err != nil {
			t.Fatal(err)
		}
	}
	key := b.tenant(t, "acme", lim(100_000, "1000"))
	r := b.call(t, key, http.MethodPost, "/v1/admissions",
		`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":1000,"service_tier":"flex"}`)
	var adm admitted
	r.json(&adm)
	if r.Code != http.StatusCreated {
		t.Fatalf("reserve: %d %s", r.Code, r.Body)
	}
	a := b.mustAdmission(t, adm.ID)
	// At flex: 1000 output tokens at 5.00 = 0.005, and the input at 1.25.
	in := a.Estimate.InputTokens
	if a.PriceTier != "flex" || *a.MoneyEstimate != (in*1_250_000+1000*5_000_000+999_999)/1_000_000 {
		t.Fatalf("reserved %d at %q for %d input tokens", *a.MoneyEstimate, a.PriceTier, in)
	}
	for _, bad := range []string{`"turbo"`, `""`, `7`} {
		r := b.call(t, key, http.MethodPost, "/v1/admissions/"+adm.ID+"/settle",
			`{"usage":{"prompt_tokens":10,"completion_tokens":100,"service_tier":`+bad+`}}`)
		if r.Code != http.StatusBadRequest || r.errorBody().Error.Field != "usage.service_tier" {
			t.Errorf("tier %s: %d %s, want 400 naming usage.service_tier", bad, r.Code, r.Body)
		}
	}
	if a := b.mustAdmission(t, adm.ID); a.State != account.StateReserved {
		t.Fatalf("a refused settle ended it: %s", a.State)
	}
	r = b.call(t, key, http.MethodPost, "/v1/admissions/"+adm.ID+"/settle",
		`{"usage":{"prompt_tokens":10,"completion_tokens":100,"service_tier":"priority"}}`)
	if r.Code != http.StatusOK {
		t.Fatalf("settle: %d %s", r.Code, r.Body)
	}
	// At priority: 10 * 5.00 + 100 * 20.00 per million = 2050 micro.
	if a := b.mustAdmission(t, adm.ID); *a.MoneyActual != 2050 {
		t.Fatalf("settled %d, want 2050 at priority", *a.MoneyActual)
	}
}
