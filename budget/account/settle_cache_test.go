package account_test

import (
	"errors"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// TestSettleCacheWrites: a settle's cache writes are parts of its input,
// priced at the model's cache-write weights (Claude's seeded 1.25 and 2,
// reads at 0.1); writes that are negative, or that add up with the reads
// to more than the input, are a *UsageError, and a refund may not come
// with them.
func TestSettleCacheWrites(t *testing.T) {
	t.Parallel()
	e := estimator.Estimate{Model: "claude-sonnet-4-5-20250929", InputTokens: 10, OutputTokens: 100, Cost: 110}
	p := account.SettleParams{TenantID: "acme", AdmissionID: "adm_1", InputTokens: 1300, OutputTokens: 40,
		CachedInputTokens: 1000, CacheWriteTokens: 50, CacheWrite1hTokens: 150}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	// 100 uncached + ceil(1000 x 0.1 + 50 x 1.25 + 150 x 2) = 563.
	if in, out := p.Usage(e, nil); in != 563 || out != 40 {
		t.Fatalf("Usage = %d, %d; want 563, 40", in, out)
	}
	for _, bad := range []account.SettleParams{
		{InputTokens: 100, CacheWriteTokens: -1},
		{InputTokens: 100, CacheWrite1hTokens: -1},
		{InputTokens: 100, CachedInputTokens: 60, CacheWriteTokens: 41},
		{InputTokens: 100, CachedInputTokens: 60, CacheWriteTokens: 20, CacheWrite1hTokens: 21},
	} {
		bad.TenantID, bad.AdmissionID = "acme", "adm_1"
		var ue *rule.UsageError
		if err := bad.Validate(); !errors.As(err, &ue) || ue.Field != "cache_creation_input_tokens" {
			t.Errorf("%+v: %v, want a UsageError on cache_creation_input_tokens", bad, err)
		}
	}
	var inv *rule.InvalidError
	if err := (account.SettleParams{TenantID: "acme", AdmissionID: "adm_1", RefundTokens: 5, CacheWriteTokens: 1}).Validate(); !errors.As(err, &inv) {
		t.Errorf("a refund with cache writes: %v", err)
	}
}
