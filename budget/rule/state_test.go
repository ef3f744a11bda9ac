package rule_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

// step is one moment of an ordered scenario over a frozen clock: advance
// the state to at, then decide (and, if admitted, debit) cost, or end an
// earlier admission. want is the decision ("ok", a limit name, or
// "too_large"); tokens and open are the state after the step.
type step struct {
	at       time.Duration // since the scenario's start
	cost     int64
	end      *endStep
	want     string
	retry    time.Duration // for a rejection
	tokens   int64         // whole tokens after the step
	open     int64
	periodOK int64 // period used after the step, when a period budget is set
}

type endStep struct {
	estimate, actual int64
	createdAt        time.Duration
	late             bool
}

func runScenario(t *testing.T, s rule.TenantState, start time.Time, steps []step) {
	t.Helper()
	for i, st := range steps {
		now := start.Add(st.at)
		s.Advance(now)
		if st.end != nil {
			s.End(st.end.estimate, st.end.actual, start.Add(st.end.createdAt), st.end.late)
		} else {
			err := rule.Decide(s, st.cost, now)
			var rej *rule.RejectedError
			var tl *rule.TooLargeError
			switch {
			case err == nil:
				if st.want != "ok" {
					t.Fatalf("step %d (cost %d at %s): admitted, want %s", i, st.cost, st.at, st.want)
				}
				s.Debit(st.cost)
			case errors.As(err, &rej):
				if string(rej.Limit) != st.want || rej.RetryAfter != st.retry {
					t.Fatalf("step %d (cost %d at %s): rejected by %s after %s, want %s after %s", i, st.cost, st.at, rej.Limit, rej.RetryAfter, st.want, st.retry)
				}
			case errors.As(err, &tl):
				if st.want != "too_large" {
					t.Fatalf("step %d: too large (%v), want %s", i, err, st.want)
				}
			default:
				t.Fatalf("step %d: %v", i, err)
			}
		}
		if got := s.Snapshot("t", now).Tokens(); got != st.tokens {
			t.Fatalf("step %d at %s: %d tokens, want %d", i, st.at, got, st.tokens)
		}
		if s.Open != st.open {
			t.Fatalf("step %d at %s: %d open, want %d", i, st.at, s.Open, st.open)
		}
		if used := s.Snapshot("t", now).PeriodUsed; s.Limits.PeriodBudget > 0 && used != st.periodOK {
			t.Fatalf("step %d at %s: period used %d, want %d", i, st.at, used, st.periodOK)
		}
	}
}

func newState(l rule.Limits, at time.Time) rule.TenantState {
	if err := l.Validate(); err != nil { // as every way of making limits does: period_budget becomes a window
		panic(err)
	}
	s := rule.TenantState{Limits: l}
	s.Tokens = rule.Bucket{CapacityMicro: l.TokensCapacity * rule.Micro, RateMicro: l.TokensRateMicro,
		BalanceMicro: l.TokensCapacity * rule.Micro, At: at}
	if l.RequestsCapacity > 0 {
		s.Requests = rule.Bucket{CapacityMicro: l.RequestsCapacity * rule.Micro, RateMicro: l.RequestsRateMicro,
			BalanceMicro: l.RequestsCapacity * rule.Micro, At: at}
	}
	return s
}

// TestDecideScenarios is the admission decision in ordered scenarios over a
// frozen clock: each limit refusing with its exact Retry-After, refill,
// the order of the checks, requests that can never fit, and how settles,
// releases and expiries give back.
func TestDecideScenarios(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 12, 31, 23, 59, 58, 0, time.UTC)
	scenarios := []struct {
		name   string
		limits rule.Limits
		steps  []step
	}{
		{"token bucket refills exactly", rule.Limits{TokensCapacity: 100, TokensRateMicro: 10 * rule.Micro}, []step{
			{cost: 60, want: "ok", tokens: 40, open: 1},
			{cost: 50, want: "tokens", retry: time.Second, tokens: 40, open: 1}, // 10 short at 10/s
			{at: 999 * time.Millisecond, cost: 50, want: "tokens", retry: time.Millisecond, tokens: 49, open: 1},
			{at: time.Second, cost: 50, want: "ok", tokens: 0, open: 2},
			{at: 100 * time.Second, cost: 0, want: "ok", tokens: 100, open: 3}, // refill stops at capacity
			{at: 100 * time.Second, cost: 101, want: "too_large", tokens: 100, open: 3},
		}},
		{"a fractional rate rounds the wait up to the millisecond", rule.Limits{TokensCapacity: 10, TokensRateMicro: 333_333}, []step{
			{cost: 10, want: "ok", tokens: 0, open: 1},
			{cost: 1, want: "tokens", retry: 3001 * time.Millisecond, tokens: 0, open: 1}, // 1e6/333333 us = 3.000003 s
		}},
		{"tokens are checked before requests, requests before concurrency", rule.Limits{TokensCapacity: 10, TokensRateMicro: rule.Micro,
			RequestsCapacity: 1, RequestsRateMicro: rule.Micro / 2, MaxConcurrent: 1}, []step{
			{cost: 5, want: "ok", tokens: 5, open: 1},
			{cost: 6, want: "tokens", retry: time.Second, tokens: 5, open: 1},
			{cost: 1, want: "requests", retry: 2 * time.Second, tokens: 5, open: 1},
			{at: 2 * time.Second, cost: 1, want: "concurrency", retry: rule.ConcurrencyRetryHint, tokens: 7, open: 1},
			{at: 2 * time.Second, end: &endStep{estimate: 5, actual: 2}, tokens: 10, open: 0}, // refund capped at capacity
			{at: 2 * time.Second, cost: 1, want: "ok", tokens: 9, open: 1},
		}},
		{"period budget rolls at midnight UTC", rule.Limits{TokensCapacity: 100, TokensRateMicro: 100 * rule.Micro,
			PeriodBudget: 150, Period: rule.PeriodDay}, []step{
			{cost: 100, want: "ok", tokens: 0, open: 1, periodOK: 100},
			{at: time.Second, cost: 60, want: "period_budget", retry: time.Second, tokens: 100, open: 1, periodOK: 100},
			{at: 2 * time.Second, cost: 60, want: "ok", tokens: 40, open: 2, periodOK: 60}, // a new day
			{at: 2 * time.Second, cost: 151, want: "too_large", tokens: 40, open: 2, periodOK: 60},
			// The first reservation, from yesterday, settles for less: the
			// refund returns nothing to today's window.
			{at: 2 * time.Second, end: &endStep{estimate: 100, actual: 10}, tokens: 100, open: 1, periodOK: 60},
			// Today's settles for more: the extra counts today.
			{at: 2 * time.Second, end: &endStep{estimate: 60, actual: 80, createdAt: 2 * time.Second}, tokens: 80, open: 0, periodOK: 80},
		}},
		{"an extra charge makes debt that refill pays back", rule.Limits{TokensCapacity: 100, TokensRateMicro: 10 * rule.Micro}, []step{
			{cost: 100, want: "ok", tokens: 0, open: 1},
			{end: &endStep{estimate: 100, actual: 150}, tokens: -50, open: 0},
			{at: 5 * time.Second, cost: 1, want: "tokens", retry: 100 * time.Millisecond, tokens: 0, open: 0}, // the debt is paid, 1 token is 0.1 s away
			{at: 10 * time.Second, cost: 50, want: "ok", tokens: 0, open: 1},
		}},
		{"a late settle does not free the slot again", rule.Limits{TokensCapacity: 10, TokensRateMicro: rule.Micro, MaxConcurrent: 2}, []step{
			{cost: 5, want: "ok", tokens: 5, open: 1},
			{end: &endStep{estimate: 5, actual: 5, late: true}, tokens: 5, open: 1},
		}},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			runScenario(t, newState(sc.limits, start), start, sc.steps)
		})
	}
}

// TestDecideChangesNothing: a refusal consumes nothing, so deciding is pure.
func TestDecideChangesNothing(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := newState(rule.Limits{TokensCapacity: 10, TokensRateMicro: rule.Micro, MaxConcurrent: 1}, now)
	s.Open = 1
	before := s
	if err := rule.Decide(s, 5, now); !errors.Is(err, rule.ErrRejected) {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(s, before) {
		t.Fatalf("Decide changed the state: %+v -> %+v", before, s)
	}
}
