package rule_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/budget/rule"
)

// TestRequirePrice: a model without a price is refused where an enforced
// window counts money, naming the window and the level; a window of
// tokens, or a shadow period budget, requires no price.
func TestRequirePrice(t *testing.T) {
	t.Parallel()
	money, err := rule.ParseWindows([]rule.WindowJSON{{Name: "daily", Unit: "day", Money: ptr("25")}})
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := rule.ParseWindows([]rule.WindowJSON{{Name: "daily", Unit: "day", Tokens: ptr(int64(1000))}})
	if err != nil {
		t.Fatal(err)
	}
	var inv *rule.InvalidError
	if err := rule.RequirePrice("m", "acme", rule.Limits{Windows: money}); !errors.As(err, &inv) || inv.Field != "model" ||
		!strings.Contains(inv.Reason, "window daily of acme") || !strings.Contains(inv.Reason, `"m"`) {
		t.Fatalf("money window: %v", err)
	}
	if err := rule.RequirePrice("m", "acme", rule.Limits{Windows: tokens}); err != nil {
		t.Fatalf("tokens window: %v", err)
	}
	shadow := rule.Limits{Windows: money, Shadow: rule.LimitSet(0).With(rule.LimitPeriodBudget)}
	if err := rule.RequirePrice("m", "acme", shadow); err != nil {
		t.Fatalf("shadow money window: %v", err)
	}
	if err := rule.RequirePrice("m", "acme", rule.Limits{}); err != nil {
		t.Fatalf("no window: %v", err)
	}
}

// TestMoneyKept: a refund keeps the share of the money it keeps of the
// cost, rounded toward zero, exact past int64's products; nothing of an
// estimate that cost nothing, nor of a refund of it all or more.
func TestMoneyKept(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ money, cost, refund, want int64 }{
		{1000, 100, 25, 750},
		{1000, 3, 1, 666},
		{1000, 100, 100, 0},
		{1000, 100, 500, 0},
		{1000, 0, 1, 0},
		{math.MaxInt64, math.MaxInt64, 1, math.MaxInt64 - 1},
	} {
		if got := rule.MoneyKept(c.money, c.cost, c.refund); got != c.want {
			t.Errorf("MoneyKept(%d, %d, %d) = %d, want %d", c.money, c.cost, c.refund, got, c.want)
		}
	}
}
