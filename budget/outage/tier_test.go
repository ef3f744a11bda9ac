package outage_test

import (
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// TestReplayKeepsServiceTiers: an admission made during an outage for a
// flex request, settled there at the priority tier its upstream reported,
// is replayed reserved at the flex price and settled at the priority one,
// as the store would have priced them.
func TestReplayKeepsServiceTiers(t *testing.T) {
	t.Parallel()
	b := setup(t, rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1}, 1)
	if _, err := b.store.Pool().Exec(ctx, `INSERT INTO model_prices (model, service_tier, input_micro, output_micro, effective_from, created_by)
		SELECT 'gpt-4o', s, i, o, '2026-01-01', 'test' FROM (VALUES ('default', 2000000, 8000000), ('flex', 1000000, 4000000),
			('priority', 4000000, 16000000)) v (s, i, o)`); err != nil {
		t.Fatal(err)
	}
	e := est(2_000) // 1 000 in, 1 000 out
	e.ServiceTier = "flex"
	r, err := b.local.Reserve(b.snap, rp(e, ""))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.local.Settle(account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 1_000, OutputTokens: 500,
		ServiceTier: "priority", Actor: "key:k"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.local.Replay(ctx, b.store); err != nil {
		t.Fatal(err)
	}
	a, err := b.store.AdmissionGet(ctx, "acme", r.AdmissionID)
	if err != nil {
		t.Fatal(err)
	}
	// Reserved at flex: 1 000 * 1 + 1 000 * 4 = 5 000 micro; settled at
	// priority: 1 000 * 4 + 500 * 16 = 12 000.
	if a.PriceTier != "flex" || a.MoneyEstimate == nil || *a.MoneyEstimate != 5_000 || a.MoneyActual == nil || *a.MoneyActual != 12_000 {
		t.Fatalf("replayed at %q: %v / %v", a.PriceTier, a.MoneyEstimate, a.MoneyActual)
	}
}
