package rule_test

import (
	"errors"
	"math"
	"testing"

	"github.com/tokengate/tokengate/budget/rule"
)

// TestCheckAdmissionName: a settle or release names its admission one way
// exactly.
func TestCheckAdmissionName(t *testing.T) {
	t.Parallel()
	var inv *rule.InvalidError
	for _, c := range []struct {
		id, key string
		ok      bool
	}{{"adm_1", "", true}, {"", "k", true}, {"", "", false}, {"adm_1", "k", false}} {
		err := rule.CheckAdmissionName(c.id, c.key)
		if (err == nil) != c.ok || (err != nil && (!errors.As(err, &inv) || inv.Field != "admission_id")) {
			t.Errorf("%q %q: %v", c.id, c.key, err)
		}
	}
}

// TestCheckRefund: a refund is never negative and states the usage by
// itself; reasoning is a part of the output, which must be 0 anyway.
func TestCheckRefund(t *testing.T) {
	t.Parallel()
	var inv *rule.InvalidError
	for _, c := range []struct {
		refund int64
		u      rule.Usage
		ok     bool
	}{
		{0, rule.Usage{Input: 5, Output: 5}, true},
		{10, rule.Usage{}, true},
		{10, rule.Usage{Reasoning: 1}, true},
		{-1, rule.Usage{}, false},
		{10, rule.Usage{Input: 1}, false},
		{10, rule.Usage{Output: 1}, false},
		{10, rule.Usage{CacheRead: 1}, false},
		{10, rule.Usage{CacheWrite5m: 1}, false},
		{10, rule.Usage{CacheWrite1h: 1}, false},
	} {
		err := rule.CheckRefund(c.refund, c.u)
		if (err == nil) != c.ok || (err != nil && (!errors.As(err, &inv) || inv.Field != "refund_tokens")) {
			t.Errorf("%d %+v: %v", c.refund, c.u, err)
		}
	}
	for _, c := range []struct{ cost, refund, want int64 }{{100, 30, 70}, {100, 100, 0}, {100, 500, 0}, {math.MinInt64, math.MaxInt64, 0}} {
		if got := rule.RefundUsage(c.cost, c.refund); got != c.want {
			t.Errorf("RefundUsage(%d, %d) = %d, want %d", c.cost, c.refund, got, c.want)
		}
	}
}
