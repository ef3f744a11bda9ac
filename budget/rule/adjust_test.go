package rule_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/rule"
)

// TestCheckAdjustment: an adjustment needs an amount within ±MaxAmount
// and a reason, trimmed, of at most MaxAdjustmentReason bytes.
func TestCheckAdjustment(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		tokens int64
		reason string
		want   error
	}{
		{0, "why", rule.ErrBadAdjustment},
		{5, "  ", rule.ErrBadAdjustment},
		{5, strings.Repeat("x", rule.MaxAdjustmentReason+1), rule.ErrBadAdjustment},
		{rule.MaxAmount + 1, "why", rule.ErrOverflow},
		{-rule.MaxAmount - 1, "why", rule.ErrOverflow},
		{rule.MaxAmount, "why", nil},
		{-rule.MaxAmount, " " + strings.Repeat("x", rule.MaxAdjustmentReason) + " ", nil},
	} {
		reason, err := rule.CheckAdjustment(c.tokens, c.reason)
		if !errors.Is(err, c.want) || (err == nil && reason != strings.TrimSpace(c.reason)) {
			t.Errorf("%d %q: %q %v, want %v", c.tokens, c.reason, reason, err, c.want)
		}
	}
}

// TestBucketAdjust: a credit passes the capacity; a debit stops at the
// debt floor exactly, and one past it or past int64 changes nothing.
func TestBucketAdjust(t *testing.T) {
	t.Parallel()
	b := rule.Bucket{CapacityMicro: 100 * rule.Micro, RateMicro: rule.Micro, BalanceMicro: 50 * rule.Micro}
	if d, err := b.Adjust(100); err != nil || d != 100*rule.Micro || b.BalanceMicro != 150*rule.Micro {
		t.Fatalf("credit: %d %v, balance %d", d, err, b.BalanceMicro)
	}
	if d, err := b.Adjust(-250); err != nil || d != -250*rule.Micro || b.BalanceMicro != b.Floor() {
		t.Fatalf("debit to the floor: %d %v, balance %d", d, err, b.BalanceMicro)
	}
	if _, err := b.Adjust(-1); !errors.Is(err, rule.ErrDebtFloor) || b.BalanceMicro != b.Floor() {
		t.Fatalf("past the floor: %v, balance %d", err, b.BalanceMicro)
	}
	full := rule.Bucket{CapacityMicro: 100 * rule.Micro, BalanceMicro: math.MaxInt64 - rule.Micro/2}
	if _, err := full.Adjust(1); !errors.Is(err, rule.ErrOverflow) || full.BalanceMicro != math.MaxInt64-rule.Micro/2 {
		t.Fatalf("past int64: %v, balance %d", err, full.BalanceMicro)
	}
}
