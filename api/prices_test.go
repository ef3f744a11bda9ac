package api_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/tokengate/tokengate/estimator"
)

type priceBody struct {
	Model           string       `json:"model"`
	EffectiveFrom   time.Time    `json:"effective_from"`
	Currency        string       `json:"currency"`
	Input           json.Number  `json:"input"`
	Output          json.Number  `json:"output"`
	CachedInput     *json.Number `json:"cached_input"`
	ReasoningOutput *json.Number `json:"reasoning_output"`
	LongContext     *struct {
		Threshold int64       `json:"threshold"`
		Input     json.Number `json:"input"`
	} `json:"long_context"`
	Source    string `json:"source"`
	CreatedBy string `json:"created_by"`
}

// TestAdminPrices: POST adds rows (now or later, never in the past), each
// refused body is a 400 naming its field and stores nothing, GET lists the
// table in effect now or at ?at=, GET /{model} the history; no route
// changes or removes a row.
func TestAdminPrices(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	token := b.admin(t, "ops")
	count := func() int {
		t.Helper()
		var n int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM model_prices`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	r := b.adminCall(t, token, http.MethodPost, "/v1/admin/prices",
		`{"model":"gpt-4o","input":"2.50","output":10,"cached_input":1.25,"long_context":{"threshold":200000,"input":"5","output":"20"}}`)
	var p priceBody
	r.json(&p)
	if r.Code != http.StatusCreated || p.Input != "2.5" || p.Output != "10" || *p.CachedInput != "1.25" || p.Currency != "USD" ||
		p.CreatedBy != "admin:ops" || p.Source != "api" || p.LongContext == nil || p.LongContext.Threshold != 200000 || p.ReasoningOutput != nil {
		t.Fatalf("create: %d %s", r.Code, r.Body)
	}
	now := p.EffectiveFrom
	later := time.Now().Add(24 * time.Hour).UTC().Truncate(time.Second)
	r = b.adminCall(t, token, http.MethodPost, "/v1/admin/prices",
		`{"model":"gpt-4o","input":"2","output":"8","reasoning_output":"12","effective_from":"`+later.Format(time.RFC3339)+`"}`)
	if r.Code != http.StatusCreated {
		t.Fatalf("create later: %d %s", r.Code, r.Body)
	}

	for _, bad := range []struct{ body, field string }{
		{`{"input":"1","output":"1"}`, "model"},
		{`{"model":"m","output":"1"}`, "input"},
		{`{"model":"m","input":"1"}`, "output"},
		{`{"model":"m","input":"-1","output":"1"}`, "input"},
		{`{"model":"m","input":"1.0000001","output":"1"}`, "input"},
		{`{"model":"m","input":"1","output":"abc"}`, "output"},
		{`{"model":"m","input":"1","output":"1","cached_input":"x"}`, "cached_input"},
		{`{"model":"m","input":"1","output":"1","cache_write_1h":-2}`, "cache_write_1h"},
		{`{"model":"m","input":"1","output":"1","effective_from":"2020-01-01T00:00:00Z"}`, "effective_from"},
		{`{"model":"m","input":"1","output":"1","effective_from":"tomorrow"}`, "effective_from"},
		{`{"model":"gpt-4o","input":"1","output":"1","effective_from":"` + later.Format(time.RFC3339) + `"}`, "effective_from"},
		{`{"model":"m","input":"1","output":"1","currency":"EUR"}`, "currency"},
		{`{"model":"m","input":"1","output":"1","currency":"usd"}`, "currency"},
		{`{"model":"m","input":"1","output":"1","long_context":{"input":"1","output":"1"}}`, "long_context.threshold"},
		{`{"model":"m","input":"1","output":"1","long_context":{"threshold":0,"input":"1","output":"1"}}`, "long_context.threshold"},
		{`{"model":"m","input":"1","output":"1","long_context":{"threshold":10,"output":"1"}}`, "long_context.input"},
		{`{"model":" m","input":"1","output":"1"}`, "model"},
		{`{"model":"m","input":"1","output":"1","price":"1"}`, "price"},
		{`{"model":"m","input":"1","output":"1"} {}`, "body"},
		{`{"model":"m","input":"1","output":"1"`, "body"},
	} {
		if r := b.adminCall(t, token, http.MethodPost, "/v1/admin/prices", bad.body); r.Code != http.StatusBadRequest || r.errorBody().Error.Field != bad.field {
			t.Errorf("%s: %d %s, want 400 naming %s", bad.body, r.Code, r.Body, bad.field)
		}
	}
	if n := count(); n != 2 {
		t.Fatalf("%d rows after refused bodies, want 2", n)
	}

	var list struct {
		Prices []priceBody `json:"prices"`
	}
	b.adminCall(t, token, http.MethodGet, "/v1/admin/prices", nil).json(&list)
	if len(list.Prices) != 1 || list.Prices[0].Input != "2.5" {
		t.Fatalf("in effect now: %+v", list)
	}
	b.adminCall(t, token, http.MethodGet, "/v1/admin/prices?at="+url.QueryEscape(later.Format(time.RFC3339)), nil).json(&list)
	if len(list.Prices) != 1 || list.Prices[0].Input != "2" || *list.Prices[0].ReasoningOutput != "12" {
		t.Fatalf("in effect later: %+v", list)
	}
	b.adminCall(t, token, http.MethodGet, "/v1/admin/prices?at="+url.QueryEscape(now.Add(-time.Second).Format(time.RFC3339)), nil).json(&list)
	if len(list.Prices) != 0 {
		t.Fatalf("in effect before the first price: %+v", list)
	}
	if r := b.adminCall(t, token, http.MethodGet, "/v1/admin/prices?at=yesterday", nil); r.Code != 400 || r.errorBody().Error.Field != "at" {
		t.Fatalf("bad at: %d %s", r.Code, r.Body)
	}
	b.adminCall(t, token, http.MethodGet, "/v1/admin/prices/gpt-4o", nil).json(&list)
	if len(list.Prices) != 2 || list.Prices[0].Input != "2.5" || list.Prices[1].Input != "2" {
		t.Fatalf("history: %+v", list)
	}
	if r := b.adminCall(t, token, http.MethodGet, "/v1/admin/prices/none", nil); r.Code != http.StatusNotFound {
		t.Fatalf("history of an unpriced model: %d", r.Code)
	}
	for _, m := range []string{http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if r := b.adminCall(t, token, m, "/v1/admin/prices/gpt-4o", `{}`); r.Code != http.StatusMethodNotAllowed && r.Code != http.StatusNotFound {
			t.Fatalf("%s a price: %d", m, r.Code)
		}
	}
	if r := b.call(t, "", http.MethodGet, "/v1/admin/prices", ""); r.Code != http.StatusUnauthorized {
		t.Fatalf("no admin token: %d", r.Code)
	}
	if n := count(); n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}

	// The imported default table is what the API lists.
	f, _ := estimator.DefaultPriceFile()
	if _, err := estimator.PriceImport(ctx, b.pool, f, "cli"); err != nil {
		t.Fatal(err)
	}
	ps, _ := f.Prices()
	b.adminCall(t, token, http.MethodGet, "/v1/admin/prices", nil).json(&list)
	if len(list.Prices) != len(ps) {
		t.Fatalf("after the import: %d prices, want %d", len(list.Prices), len(ps))
	}
}
