package alert_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget"
	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// TestThresholdsCrossedInNumeric: a period budget and usage near int64's
// end cross thresholds without error: usage * 100 is compared in numeric,
// where in bigint it overflowed and failed the deciding transaction.
func TestThresholdsCrossedInNumeric(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	store := budget.NewStore(pool)
	if _, err := store.CreateTenant(ctx, budget.CreateTenantParams{ID: "acme", Limits: budget.Limits{TokensCapacity: 100, TokensRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	s := alert.NewStore(pool, testKey)
	ep, _, err := s.CreateEndpoint(ctx, "https://example.com/hook", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateRule(ctx, alert.RuleParams{TenantID: "acme", EndpointID: ep.ID, Kind: alert.KindPeriodBudget, Thresholds: []int32{20, 50, 80, 100}}); err != nil {
		t.Fatal(err)
	}
	var c alert.Crossings
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	const per = 4_000_000_000_000_000_000 // * 100 is beyond int64
	c.Add("acme", per/4, per, per, start, start.AddDate(0, 1, 0))
	if _, err := pool.Exec(ctx, alert.ThresholdsCrossedSQL, c.Args()...); err != nil {
		t.Fatalf("thresholds crossed near int64's end: %v", err)
	}
	var got []float64
	for _, e := range events(t, s, "acme") {
		var d struct {
			Pct  float64     `json:"threshold_percent"`
			Used json.Number `json:"period_used"`
		}
		if err := json.Unmarshal(e.Data, &d); err != nil || d.Used.String() != "4000000000000000000" {
			t.Fatalf("event %s: %v", e.Data, err)
		}
		got = append(got, d.Pct)
	}
	if len(got) != 3 {
		t.Fatalf("thresholds raised %v, want 50, 80 and 100 (20 was behind already)", got)
	}
}
