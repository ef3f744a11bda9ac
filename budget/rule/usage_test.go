package rule_test

import (
	"errors"
	"testing"

	"github.com/tokengate/tokengate/budget/rule"
)

// TestUsageCheck: a claimed usage is refused at one past each bound,
// naming the field, and accepted at the bound itself.
func TestUsageCheck(t *testing.T) {
	t.Parallel()
	const m = rule.MaxTokens
	for _, c := range []struct {
		name  string
		u     rule.Usage
		field string // "": valid
		bound int64
	}{
		{"zero", rule.Usage{}, "", 0},
		{"at the bounds", rule.Usage{Input: m, Output: m, Reasoning: m, CacheRead: m - 2, CacheWrite5m: 1, CacheWrite1h: 1}, "", 0},
		{"input past", rule.Usage{Input: m + 1}, rule.FieldInput, m},
		{"output past", rule.Usage{Output: m + 1}, rule.FieldOutput, m},
		{"input negative", rule.Usage{Input: -1}, rule.FieldInput, m},
		{"output negative", rule.Usage{Output: -1}, rule.FieldOutput, m},
		{"cache read past input", rule.Usage{Input: 40, CacheRead: 41}, rule.FieldCacheRead, 40},
		{"cache read negative", rule.Usage{Input: 40, CacheRead: -1}, rule.FieldCacheRead, 40},
		{"writes past what reads leave", rule.Usage{Input: 100, CacheRead: 60, CacheWrite5m: 41}, rule.FieldCacheWrite, 40},
		{"1h writes past", rule.Usage{Input: 100, CacheRead: 60, CacheWrite1h: 41}, rule.FieldCacheWrite, 40},
		{"both writes past", rule.Usage{Input: 100, CacheRead: 60, CacheWrite5m: 20, CacheWrite1h: 21}, rule.FieldCacheWrite, 19},
		{"5m negative", rule.Usage{Input: 100, CacheWrite5m: -1}, rule.FieldCacheWrite, 100},
		{"reasoning past output", rule.Usage{Output: 25, Reasoning: 26}, rule.FieldReasoning, 25},
		{"reasoning of a negative output", rule.Usage{Output: -5, Reasoning: 1}, rule.FieldReasoning, 0},
		// The part is named before the total it is part of.
		{"part before total", rule.Usage{Input: m + 1, CacheRead: -1}, rule.FieldCacheRead, m + 1},
	} {
		err := c.u.Check()
		var ue *rule.UsageError
		switch {
		case c.field == "" && err != nil:
			t.Errorf("%s: %v, want valid", c.name, err)
		case c.field != "" && (!errors.As(err, &ue) || ue.Field != c.field || ue.Bound != c.bound || !errors.Is(err, rule.ErrUsageOutOfBounds)):
			t.Errorf("%s: %v (%+v), want a UsageError on %s bounded by %d", c.name, err, ue, c.field, c.bound)
		}
	}
}

// TestUsageClamp: a reported usage is brought within the bounds (negative
// to 0, past the bound to the bound, parts within what is left of their
// total), says so, and a usage within them is left as it is. What Clamp
// returns always passes Check.
func TestUsageClamp(t *testing.T) {
	t.Parallel()
	const m = rule.MaxTokens
	for _, c := range []struct {
		name string
		u    rule.Usage
		want rule.Usage
	}{
		{"within", rule.Usage{Input: 100, Output: 40, Reasoning: 10, CacheRead: 50, CacheWrite5m: 20, CacheWrite1h: 30},
			rule.Usage{Input: 100, Output: 40, Reasoning: 10, CacheRead: 50, CacheWrite5m: 20, CacheWrite1h: 30}},
		{"at the bound", rule.Usage{Input: m, Output: m}, rule.Usage{Input: m, Output: m}},
		{"past the bound", rule.Usage{Input: m + 1, Output: 1 << 62}, rule.Usage{Input: m, Output: m}},
		{"negative", rule.Usage{Input: -1, Output: -7, Reasoning: -3, CacheRead: -2}, rule.Usage{}},
		{"reasoning past output", rule.Usage{Output: 5, Reasoning: 9}, rule.Usage{Output: 5, Reasoning: 5}},
		{"parts past input, in order", rule.Usage{Input: 100, CacheRead: 70, CacheWrite5m: 20, CacheWrite1h: 30},
			rule.Usage{Input: 100, CacheRead: 70, CacheWrite5m: 20, CacheWrite1h: 10}},
		{"parts of a negative input", rule.Usage{Input: -5, CacheRead: 3}, rule.Usage{}},
	} {
		got, clamped := c.u.Clamp()
		if got != c.want || clamped != (c.u != c.want) {
			t.Errorf("%s: Clamp(%+v) = %+v, %v; want %+v, %v", c.name, c.u, got, clamped, c.want, c.u != c.want)
		}
		if err := got.Check(); err != nil {
			t.Errorf("%s: the clamped usage fails Check: %v", c.name, err)
		}
	}
}
