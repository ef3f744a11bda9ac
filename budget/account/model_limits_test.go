package account_test

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

func inOut(tenantID string, in, out int64) account.ReserveParams {
	return account.ReserveParams{TenantID: tenantID, Estimate: estimator.Estimate{Model: "gpt-4o", Family: "gpt-4o", InputTokens: in,
		OutputTokens: out, Cost: in + out, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}
}

// modelBalances reads a tenant's model buckets (whole tokens).
func modelBalances(t *testing.T, b *testBundle, tenantID string) (in, out int64) {
	t.Helper()
	if err := b.pool.QueryRow(ctx, `SELECT input_micro / 1000000, output_micro / 1000000 FROM tenant_model_limits
		WHERE tenant_id = $1 AND model = 'gpt-4o'`, tenantID).Scan(&in, &out); err != nil {
		t.Fatal(err)
	}
	return in, out
}

// Per-model input and output buckets over two replicas, on a frozen clock
// (no refill, so every bound is exact): the organisation's output bucket
// and each team's input bucket hold exactly, settles correct the output to
// what was used, and the ledger records every bucket after each change,
// never below zero after a reserve.
func TestModelInputOutputBucketsExact(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, s := range stores {
		s.WithClock(func() time.Time { return at })
	}
	b.store.WithClock(func() time.Time { return at })
	big := limits(1_000_000_000, "1000")
	b.tenant(t, "org", big)
	b.child(t, "t1", "org", big)
	b.child(t, "t2", "org", big)
	set := func(tenant string, l rule.ModelLimits) {
		t.Helper()
		l.Model = "gpt-4o"
		if _, err := b.store.SetModelLimits(ctx, account.SetModelLimitsParams{TenantID: tenant, Limits: l}); err != nil {
			t.Fatal(err)
		}
	}
	set("org", rule.ModelLimits{OutputCapacity: 3000, OutputRateMicro: 1})
	set("t1", rule.ModelLimits{InputCapacity: 2000, InputRateMicro: 1})
	// t2's input bucket is wide, so that t2's calls run the organisation's
	// output bucket out whatever the interleaving; t1's input runs out
	// first (about 57 calls against some 190 the output bucket admits).
	// With both teams near their input, whether the output bucket was
	// reached hung on how settles interleaved with reserves.
	set("t2", rule.ModelLimits{InputCapacity: 100_000, InputRateMicro: 1})

	var mu sync.Mutex
	sumIn := map[string]int64{}
	var sumOut int64
	refusedBy := map[string]int{}
	hammer(stores, func(g int, s *account.Store) {
		tenant := []string{"t1", "t2"}[g%2]
		for i := range 5 {
			in, out := int64(10+(g*7+i*13)%50), int64(5+(g*11+i*3)%40)
			r, err := s.Reserve(ctx, inOut(tenant, in, out))
			var rej *rule.RejectedError
			if errors.As(err, &rej) {
				mu.Lock()
				refusedBy[rej.Level+"/"+rej.Model+"/"+string(rej.Limit)]++
				mu.Unlock()
				continue
			}
			if err != nil {
				t.Error(err)
				return
			}
			used := out
			if i%2 == 0 { // settled with less output than reserved: the rest comes back
				used = out / 3
				if _, err := s.Settle(ctx, account.SettleParams{TenantID: tenant, AdmissionID: r.AdmissionID, InputTokens: in, OutputTokens: used}); err != nil {
					t.Error(err)
					return
				}
			}
			mu.Lock()
			sumIn[tenant] += in
			sumOut += used
			mu.Unlock()
		}
	})
	if t.Failed() {
		return
	}
	for tenant, capacity := range map[string]int64{"t1": 2000, "t2": 100_000} {
		in, _ := modelBalances(t, b, tenant)
		if sumIn[tenant] > capacity || in != capacity-sumIn[tenant] {
			t.Fatalf("%s: admitted %d input tokens of %d; its bucket holds %d", tenant, sumIn[tenant], capacity, in)
		}
	}
	if _, out := modelBalances(t, b, "org"); out != 3000-sumOut {
		t.Fatalf("org: %d output tokens used or held; its bucket holds %d of 3000", sumOut, out)
	}
	// The ledger holds every bucket after every change, never negative after a reserve.
	rows, err := b.pool.Query(ctx, `SELECT kind, detail FROM ledger_entries WHERE tenant_id IN ('org', 't1', 't2')
		AND kind IN ('reserve', 'settle') ORDER BY tenant_id, seq`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var kind string
		var detail *string
		if err := rows.Scan(&kind, &detail); err != nil {
			t.Fatal(err)
		}
		var d struct {
			Model       string `json:"model_limits"`
			In, Out     int64
			InputMicro  int64 `json:"input_micro"`
			OutputMicro int64 `json:"output_micro"`
		}
		if detail == nil || json.Unmarshal([]byte(*detail), &d) != nil || d.Model != "gpt-4o" {
			t.Fatalf("a %s entry without its model buckets: %v", kind, detail)
		}
		if kind == "reserve" && (d.InputMicro < 0 || d.OutputMicro < 0) {
			t.Fatalf("a reserve left a model bucket negative: %+v", d)
		}
		n++
	}
	if refusedBy["org/gpt-4o/output_tokens"] == 0 || refusedBy["t1/gpt-4o/input_tokens"] == 0 {
		t.Fatalf("rejections %v: the buckets were not all reached", refusedBy)
	}
	for _, id := range []string{"org", "t1", "t2"} {
		b.verify(t, id)
	}
	t.Logf("input admitted %v, output used %d, %d entries with buckets, rejections %v", sumIn, sumOut, n, refusedBy)
}

// A request larger than a model bucket can never fit; a shadow model limit
// refuses nothing but is counted; limits changes are limits entries.
func TestModelLimitsTooLargeShadowAndChanges(t *testing.T) {
	t.Parallel()
	b, _ := setupFrozen(t)
	b.tenant(t, "acme", limits(1_000_000, "1000"))
	_, err := b.store.SetModelLimits(ctx, account.SetModelLimitsParams{TenantID: "acme", Limits: rule.ModelLimits{
		Model: "gpt-4o", InputCapacity: 100, InputRateMicro: rule.Micro, OutputCapacity: 50, OutputRateMicro: rule.Micro}})
	if err != nil {
		t.Fatal(err)
	}
	var tl *rule.TooLargeError
	if _, err := b.store.Reserve(ctx, inOut("acme", 10, 51)); !errors.As(err, &tl) || tl.Limit != rule.LimitOutputTokens || tl.Model != "gpt-4o" {
		t.Fatalf("output over capacity: %v", err)
	}
	r, err := b.store.Reserve(ctx, inOut("acme", 90, 10))
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.store.Reserve(ctx, inOut("acme", 20, 10))
	if rej := rejected(t, err, rule.LimitInputTokens); rej.RetryAfter != 10*time.Second {
		t.Fatalf("retry after %s, want the 10 s to refill 10 input tokens", rej.RetryAfter)
	}
	// Another model is not limited.
	other := inOut("acme", 500, 500)
	other.Estimate.Model, other.Estimate.Family = "gpt-4o-mini", "gpt-4o-mini"
	if _, err := b.store.Reserve(ctx, other); err != nil {
		t.Fatal(err)
	}
	// A release gives both buckets back.
	if _, err := b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: r.AdmissionID}); err != nil {
		t.Fatal(err)
	}
	if in, out := modelBalances(t, b, "acme"); in != 100 || out != 50 {
		t.Fatalf("after the release: input %d, output %d", in, out)
	}
	// Shadow: counted, not refused.
	_, err = b.store.SetModelLimits(ctx, account.SetModelLimitsParams{TenantID: "acme", Limits: rule.ModelLimits{
		Model: "gpt-4o", InputCapacity: 100, InputRateMicro: rule.Micro, Shadow: rule.LimitSet(0).With(rule.LimitInputTokens)}})
	if err != nil {
		t.Fatal(err)
	}
	b.mustReserve(t, "acme", 0) // gpt-4o with 0 tokens: fits anything
	r1, err := b.store.Reserve(ctx, inOut("acme", 80, 1))
	if err != nil || len(r1.Shadow) != 0 {
		t.Fatal(r1, err)
	}
	r2, err := b.store.Reserve(ctx, inOut("acme", 80, 1))
	if err != nil || len(r2.Shadow) != 1 || r2.Shadow[0].Limit != rule.LimitInputTokens {
		t.Fatalf("the shadow input limit: %+v %v", r2, err)
	}
	if in, _ := modelBalances(t, b, "acme"); in != 20 {
		t.Fatalf("the shadow bucket holds %d; as if enforced it holds 20", in)
	}
	var le *rule.LimitError
	if _, err := b.store.SetModelLimits(ctx, account.SetModelLimitsParams{TenantID: "acme", Limits: rule.ModelLimits{Model: "gpt-4o"}}); !errors.As(err, &le) {
		t.Fatalf("no bucket: %v", err)
	}
	if err := b.store.RemoveModelLimits(ctx, "acme", "gpt-4o", "ops"); err != nil {
		t.Fatal(err)
	}
	if err := b.store.RemoveModelLimits(ctx, "acme", "gpt-4o", "ops"); !errors.Is(err, rule.ErrModelLimitsNotFound) {
		t.Fatalf("removed twice: %v", err)
	}
	var limitsEntries int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'limits'
		AND detail LIKE '%"model":"gpt-4o"%'`).Scan(&limitsEntries); err != nil || limitsEntries != 3 {
		t.Fatalf("%d model limits entries (%v), want 3", limitsEntries, err)
	}
	// The settle of an admission made under since-removed limits still works.
	if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r2.AdmissionID, InputTokens: 80, OutputTokens: 1}); err != nil {
		t.Fatal(err)
	}
	b.verify(t, "acme")
}
