package api_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// The attack of issue 21 over HTTP: cost-1 admissions settled with a
// billion prompt and completion tokens. Each answers 422
// usage_out_of_bounds naming the field, and nothing moves.
func TestSettleAbsurdUsageIs422(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	key := b.tenant(t, "acme", lim(10_000_000, "1"))
	var a admitted
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(1, "hi")); r.Code != http.StatusCreated {
		t.Fatalf("admission: %d %s", r.Code, r.Body)
	} else {
		r.json(&a)
	}
	before, seq := b.balance(t, "acme")
	for _, c := range []struct{ usage, field string }{
		{`{"prompt_tokens":1000000000,"completion_tokens":1000000000}`, "usage.completion_tokens"},
		{`{"prompt_tokens":1000000000,"completion_tokens":1}`, "usage.prompt_tokens"},
		{`{"input_tokens":128000,"output_tokens":1}`, "usage.prompt_tokens"}, // one past gpt-4o's window
		{`{"prompt_tokens":0,"completion_tokens":2}`, "usage.completion_tokens"},
	} {
		for range 3 {
			r := b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/settle", `{"usage":`+c.usage+`}`)
			if e := r.errorBody().Error; r.Code != http.StatusUnprocessableEntity || e.Type != "usage_out_of_bounds" || e.Field != c.field {
				t.Fatalf("%s: %d %s, want 422 usage_out_of_bounds on %s", c.usage, r.Code, r.Body, c.field)
			}
			if after, seq2 := b.balance(t, "acme"); after != before || seq2 != seq {
				t.Fatalf("%s: the refused settle moved the balance or the ledger", c.usage)
			}
		}
	}
	// Within the bound, it settles.
	if r := b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/settle", `{"usage":{"prompt_tokens":9,"completion_tokens":1}}`); r.Code != http.StatusOK {
		t.Fatalf("settle within the bound: %d %s", r.Code, r.Body)
	}
}

// A model of weight 1000 (the largest): where five absurd settles wrapped
// the balance, each is now a 422, and a settle at the model's window
// charges down to the debt floor and no further.
func TestSettleHeavyModelOverHTTP(t *testing.T) {
	t.Parallel()
	est := estimator.New(nil)
	table, err := estimator.DefaultTable().With([]estimator.Model{{Name: "heavy", Encoding: estimator.EncodingO200K,
		InputWeightMicro: 1000 * estimator.WeightOne, OutputWeightMicro: 1000 * estimator.WeightOne,
		DefaultOutputTokens: 100, ContextWindow: 200_000, PartTokens: 765}})
	if err != nil {
		t.Fatal(err)
	}
	est.SetTable(table)
	b := setupAPI(t, func(c *testConfig) {
		c.Estimator = est
		c.Store.WithModels(est.Table)
	})
	const capacity = 10_000_000
	key := b.tenant(t, "acme", lim(capacity, "0.000001"))
	body := `{"model":"heavy","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`
	var a admitted
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", body); r.Code != http.StatusCreated {
		t.Fatalf("admission: %d %s", r.Code, r.Body)
	} else {
		r.json(&a)
	}
	before, seq := b.balance(t, "acme")
	for i := range 5 {
		r := b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/settle", `{"usage":{"prompt_tokens":1000000000,"completion_tokens":1}}`)
		if r.Code != http.StatusUnprocessableEntity || r.errorBody().Error.Type != "usage_out_of_bounds" {
			t.Fatalf("absurd settle %d: %d %s", i, r.Code, r.Body)
		}
	}
	if after, seq2 := b.balance(t, "acme"); after != before || seq2 != seq {
		t.Fatal("refused settles moved the balance or the ledger")
	}
	r := b.call(t, key, http.MethodPost, "/v1/admissions/"+a.ID+"/settle", `{"usage":{"prompt_tokens":199999,"completion_tokens":1}}`)
	if r.Code != http.StatusOK {
		t.Fatalf("settle at the window: %d %s", r.Code, r.Body)
	}
	if after, _ := b.balance(t, "acme"); after != -capacity*rule.Micro {
		t.Fatalf("balance %d, want the debt floor %d", after, -capacity*rule.Micro)
	}
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", body); r.Code != http.StatusTooManyRequests {
		t.Fatalf("admission in debt: %d %s", r.Code, r.Body)
	}
}

// An admin's debit past the debt floor is 422 debt_floor, an amount past
// ±1e12 or a credit past int64 is 422 amount_out_of_range; none moves
// anything.
func TestAdjustBoundsOverHTTP(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	b.tenant(t, "acme", lim(1000, "1"))
	token := b.admin(t, "ops")
	path := "/v1/admin/tenants/acme/adjustments"
	before, seq := b.balance(t, "acme")
	for _, c := range []struct {
		tokens int64
		typ    string
	}{
		{-2001, "debt_floor"},
		{-1_000_000_000_001, "amount_out_of_range"},
		{1_000_000_000_001, "amount_out_of_range"},
	} {
		r := b.adminCall(t, token, http.MethodPost, path, fmt.Sprintf(`{"tokens":%d,"reason":"test"}`, c.tokens))
		if e := r.errorBody().Error; r.Code != http.StatusUnprocessableEntity || e.Type != c.typ || e.Field != "tokens" {
			t.Fatalf("adjust %d: %d %s, want 422 %s on tokens", c.tokens, r.Code, r.Body, c.typ)
		}
	}
	if after, seq2 := b.balance(t, "acme"); after != before || seq2 != seq {
		t.Fatal("refused adjustments moved the balance or the ledger")
	}
	if r := b.adminCall(t, token, http.MethodPost, path, `{"tokens":-2000,"reason":"to the floor"}`); r.Code != http.StatusOK {
		t.Fatalf("debit to the floor: %d %s", r.Code, r.Body)
	}
	var last response
	for range 20 {
		if last = b.adminCall(t, token, http.MethodPost, path, `{"tokens":1000000000000,"reason":"credit"}`); last.Code != http.StatusOK {
			break
		}
	}
	if last.Code != http.StatusUnprocessableEntity || last.errorBody().Error.Type != "amount_out_of_range" {
		t.Fatalf("credits past int64: %d %s", last.Code, last.Body)
	}
}
