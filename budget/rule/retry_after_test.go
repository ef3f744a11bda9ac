package rule_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

// TestRetryAfterRoundsUpAndIsNeverZero: the faces used to round the same
// wait three ways, two of which could answer 0 ("retry now") for a refusal.
func TestRetryAfterRoundsUpAndIsNeverZero(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		d       time.Duration
		ms, sec int64
	}{
		{0, 1, 1},
		{-time.Second, 1, 1},
		{time.Nanosecond, 1, 1},
		{999 * time.Microsecond, 1, 1},
		{time.Millisecond, 1, 1},
		{1001 * time.Microsecond, 2, 1},
		{500 * time.Millisecond, 500, 1},
		{time.Second, 1000, 1},
		{time.Second + time.Nanosecond, 1001, 2},
		{90 * time.Second, 90000, 90},
		{time.Duration(math.MaxInt64), 9223372036855, 9223372037},
	} {
		if ms, sec := rule.RetryAfterMillis(c.d), rule.RetryAfterSeconds(c.d); ms != c.ms || sec != c.sec {
			t.Errorf("%v: %d ms, %d s; want %d ms, %d s", c.d, ms, sec, c.ms, c.sec)
		}
	}
}

// TestHugeWaitSaturatesAtNever: a refill a millionth of a token a second
// towards a deficit of 10,000 tokens takes 10^16 s, more than a Duration
// holds. Rounding it to the millisecond wrapped it negative, which the
// faces answered "Retry-After: 1" with a reset in the past (issue 36, P9):
// it saturates at NeverRefills, and so does the snapshot's full time.
func TestHugeWaitSaturatesAtNever(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	s := rule.TenantState{
		Limits: rule.Limits{TokensCapacity: 50_000, TokensRateMicro: 1},
		Tokens: rule.Bucket{CapacityMicro: 50_000 * rule.Micro, RateMicro: 1, BalanceMicro: 20_000 * rule.Micro, At: now},
	}
	refusals := rule.Refusals(s, rule.Amount{Cost: 30_000}, now)
	var rej *rule.RejectedError
	if len(refusals) != 1 || !errors.As(refusals[0], &rej) || rej.RetryAfter != rule.NeverRefills || !rej.Never() {
		t.Fatalf("refusals %v (retry after %v), want tokens refusing with NeverRefills", refusals, rej)
	}
	snap := s.Snapshot("acme", now)
	if snap.TokensFullIn != rule.NeverRefills {
		t.Fatalf("full in %v, want NeverRefills", snap.TokensFullIn)
	}
	for _, h := range snap.RateHeaders() {
		if h.Name == "X-Ratelimit-Reset-Tokens" {
			t.Fatalf("a reset header %q for a bucket that never refills in time", h.Value)
		}
	}
	// A long wait that a Duration holds is no "never".
	if rule.Never(100 * 365 * 24 * time.Hour) {
		t.Fatal("a hundred years is a wait, not never")
	}
}

// TestExhaustedWindowSaysWhatItSpent: a window that refuses is a
// *BudgetExhaustedError with its amounts and reset, which is a refusal
// (ErrRejected) and an exhausted budget, never only a rate limit.
func TestExhaustedWindowSaysWhatItSpent(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	ws, err := rule.ParseWindows([]rule.WindowJSON{{Name: "daily", Unit: "day", Money: ptr("25"), OveragePercent: 10}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	s := rule.TenantState{
		Limits:  rule.Limits{TokensCapacity: 2_000_000, TokensRateMicro: rule.Micro, Windows: ws},
		Tokens:  rule.Bucket{CapacityMicro: 2_000_000 * rule.Micro, RateMicro: rule.Micro, BalanceMicro: 2_000_000 * rule.Micro, At: now},
		Windows: []rule.WindowUsage{{Start: &start, Used: 27_000_000}},
	}
	refusals := rule.Refusals(s, rule.Amount{Cost: 100, Money: 600_000}, now)
	var exh *rule.BudgetExhaustedError
	if len(refusals) != 1 || !errors.As(refusals[0], &exh) || !errors.Is(refusals[0], rule.ErrBudgetExhausted) || !errors.Is(refusals[0], rule.ErrRejected) {
		t.Fatalf("refusals %v", refusals)
	}
	if exh.Window != "daily" || exh.Counts != rule.CountMoney || exh.Spent != 27_000_000 || exh.Budget != 25_000_000 || exh.Cap != 27_500_000 ||
		exh.Cost != 600_000 || exh.Remaining() != 500_000 || !exh.Resets.Equal(start.AddDate(0, 0, 1)) || exh.RetryAfter != 15*time.Hour {
		t.Fatalf("%+v", exh)
	}
	var rej *rule.RejectedError
	if !errors.As(refusals[0], &rej) || rej.Limit != rule.LimitPeriodBudget || rej.Window != "daily" {
		t.Fatalf("the refusal it embeds: %+v", rej)
	}
}

// ptr is v's address, for optional fields in literals.
func ptr[T any](v T) *T { return &v }
