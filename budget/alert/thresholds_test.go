package alert_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// TestThresholdsCrossedInNumeric: a period budget and usage near int64's
// end cross thresholds without error: usage * 100 is compared in numeric,
// where in bigint it overflowed and failed the deciding transaction.
func TestThresholdsCrossedInNumeric(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 100, TokensRateMicro: 1}}); err != nil {
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
	c.Add(alert.Crossing{Tenant: "acme", Window: "period", Counts: "tokens", Before: per / 4, After: per, Limit: per, Start: start, End: start.AddDate(0, 1, 0)})
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

// A soft budget admits up to its limit plus its overage, and raises
// threshold events at its own thresholds and at its limit (it is being
// overspent, on purpose), beside the thresholds of the tenant's rules, each
// once per window, keyed by the window's name.
func TestSoftBudgetRaisesItsThresholds(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	store := account.NewStore(pool).WithClock(func() time.Time { return now })
	day, err := rule.ParseWindow("day", "Asia/Tokyo", "09:00", "")
	if err != nil {
		t.Fatal(err)
	}
	l := rule.Limits{TokensCapacity: 1_000_000, TokensRateMicro: rule.Micro, Windows: []rule.WindowLimit{
		{Name: "daily", Window: day, Counts: rule.CountTokens, Limit: 1000, OveragePercent: 10, Thresholds: []int64{50}}}}
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: l}); err != nil {
		t.Fatal(err)
	}
	s := alert.NewStore(pool, testKey)
	ep, _, err := s.CreateEndpoint(ctx, "https://example.com/hook", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateRule(ctx, alert.RuleParams{TenantID: "acme", EndpointID: ep.ID, Kind: alert.KindPeriodBudget, Thresholds: []int32{90}}); err != nil {
		t.Fatal(err)
	}
	store.NotePeriodAlertRule()
	for range 11 {
		if _, err := store.Reserve(ctx, reserve("acme", 100)); err != nil {
			t.Fatal(err)
		}
	}
	// 1100: the ceiling. One more is refused, by the window.
	var rej *rule.RejectedError
	if _, err := store.Reserve(ctx, reserve("acme", 1)); !errors.As(err, &rej) || rej.Window != "daily" {
		t.Fatalf("beyond the ceiling: %v", err)
	}
	var got []string
	for _, e := range events(t, s, "acme") {
		var d struct {
			Pct    int    `json:"threshold_percent"`
			Window string `json:"window"`
			Used   int64  `json:"period_used"`
		}
		if err := json.Unmarshal(e.Data, &d); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %d%% at %d", d.Window, d.Pct, d.Used))
	}
	want := []string{"daily 50% at 500", "daily 90% at 900", "daily 100% at 1000"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}
