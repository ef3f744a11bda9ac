package rule_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

// level is a tenant with a token bucket of capacity tokens, refilling at
// rate tokens a second, holding balance tokens at now.
func level(capacity, rate, balance int64, now time.Time) *rule.TenantState {
	return &rule.TenantState{
		Limits: rule.Limits{TokensCapacity: capacity, TokensRateMicro: rate * rule.Micro},
		Tokens: rule.Bucket{CapacityMicro: capacity * rule.Micro, RateMicro: rate * rule.Micro, BalanceMicro: balance * rule.Micro, At: now},
	}
}

// TestDecideLevels: a request must fit every level of its tree; the
// refusal names its level (too large first, else the longest wait,
// nearest the caller's tenant on a tie); a shadow limit refuses nothing
// but is recorded and skipped; the holdback is the caller's own tenant's;
// and no level's state changes.
func TestDecideLevels(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	shadowTokens := func(s *rule.TenantState) *rule.TenantState {
		s.Limits.Shadow = s.Limits.Shadow.With(rule.LimitTokens)
		return s
	}
	for _, c := range []struct {
		name     string
		org      *rule.TenantState
		team     *rule.TenantState
		model    *rule.ModelState // the team's
		cost     int64
		in       int64
		holdback int64  // micro
		want     string // "" admitted, else "<kind> <level> <limit>"
		retry    time.Duration
		shadow   []rule.ShadowRefusal
	}{
		{name: "fits both", org: level(100, 1, 50, now), team: level(100, 1, 50, now), cost: 20},
		{name: "the root refuses", org: level(100, 1, 10, now), team: level(100, 1, 50, now), cost: 20,
			want: "rejected org tokens", retry: 10 * time.Second},
		{name: "the longest wait", org: level(100, 1, 10, now), team: level(100, 10, 5, now), cost: 20,
			want: "rejected org tokens", retry: 10 * time.Second},
		{name: "a tie is the caller's tenant", org: level(100, 1, 10, now), team: level(100, 1, 10, now), cost: 20,
			want: "rejected team tokens", retry: 10 * time.Second},
		{name: "too large first", org: level(15, 1, 15, now), team: level(100, 1, 0, now), cost: 20,
			want: "too_large org tokens"},
		{name: "a shadow limit refuses nothing", org: shadowTokens(level(100, 1, 10, now)), team: level(100, 1, 50, now), cost: 20,
			shadow: []rule.ShadowRefusal{{Level: "org", Limit: rule.LimitTokens}}},
		{name: "the holdback is the caller's tenant's", org: level(100, 1, 25, now), team: level(100, 1, 50, now), cost: 20, holdback: 40 * rule.Micro,
			want: "rejected team tokens", retry: 10 * time.Second},
		{name: "the model's limits", org: level(100, 1, 50, now), team: level(100, 1, 50, now), cost: 20, in: 10,
			model: &rule.ModelState{ModelLimits: rule.ModelLimits{Model: "m", InputCapacity: 5}}, want: "too_large team input_tokens"},
		{name: "a model's shadow is the model's", org: level(100, 1, 50, now), team: level(100, 1, 50, now), cost: 20, in: 10,
			model:  &rule.ModelState{ModelLimits: rule.ModelLimits{Model: "m", InputCapacity: 5, Shadow: rule.LimitSet(0).With(rule.LimitInputTokens)}},
			shadow: []rule.ShadowRefusal{{Level: "team", Limit: rule.LimitInputTokens}}},
	} {
		org, team := *c.org, *c.team
		levels := []rule.Level{{ID: "org", State: c.org}, {ID: "team", State: c.team, Model: c.model}}
		skips, shadow, err := rule.DecideLevels(levels, rule.Amount{Cost: c.cost}, c.in, 0, c.holdback, now)
		got := ""
		var rej *rule.RejectedError
		var tl *rule.TooLargeError
		switch {
		case errors.As(err, &tl):
			got = "too_large " + tl.Level + " " + string(tl.Limit)
		case errors.As(err, &rej):
			got = "rejected " + rej.Level + " " + string(rej.Limit)
			if rej.RetryAfter != c.retry {
				t.Errorf("%s: retry after %s, want %s", c.name, rej.RetryAfter, c.retry)
			}
		case err != nil:
			t.Errorf("%s: %v", c.name, err)
		}
		if got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
		if !reflect.DeepEqual(shadow, c.shadow) {
			t.Errorf("%s: shadow %v, want %v", c.name, shadow, c.shadow)
		}
		for i, s := range c.shadow {
			if len(skips) != 2 || !skips[map[string]int{"org": 0, "team": 1}[s.Level]].Has(s.Limit) {
				t.Errorf("%s: skips %v miss shadow %d", c.name, skips, i)
			}
		}
		if !reflect.DeepEqual(org, *c.org) || !reflect.DeepEqual(team, *c.team) {
			t.Errorf("%s: a decision changed a level's state", c.name)
		}
	}
}

// TestShadowedRoundTrip: what an admission records of its skipped limits
// reads back, level by level, as the skips it was debited with.
func TestShadowedRoundTrip(t *testing.T) {
	t.Parallel()
	ids := []string{"org", "team", "proj"}
	skips := []rule.LimitSet{rule.LimitSet(0).With(rule.LimitTokens).With(rule.LimitRequests), 0, rule.LimitSet(0).With(rule.LimitPeriodBudget)}
	rec := rule.Shadowed(ids, skips)
	if len(rec) != 3 {
		t.Fatalf("recorded %v", rec)
	}
	for i, id := range ids {
		if got := rule.SkipOf(rec, id); got != skips[i] {
			t.Errorf("%s: read back %v, want %v", id, got, skips[i])
		}
	}
	if rule.SkipOf(rec, "other") != 0 || rule.SkipOf([]string{"malformed"}, "malformed") != 0 {
		t.Error("a level not recorded has skips")
	}
}
