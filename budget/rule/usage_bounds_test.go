package rule_test

import (
	"errors"
	"math"
	"testing"

	"github.com/tokengate/tokengate/budget/rule"
)

// TestUsageBounds: a settle's usage is checked against the bound of what
// its admission reserved and its model's window, and an upstream's usage
// clamped to it; the clamped usage always passes the check.
func TestUsageBounds(t *testing.T) {
	t.Parallel()
	gpt := rule.UsageBounds(128_000, 100, 50)           // a model with a window of 128000
	batch := rule.UsageBounds(128_000, 200_000, 40_000) // a batch of prompts
	unknown := rule.UsageBounds(rule.MaxUnknownModelUsage, 10, 10)
	tests := []struct {
		name    string
		b       rule.UsageBound
		in, out int64
		field   string // "" for within bounds
		cin     int64
		cout    int64
	}{
		{"within", gpt, 1000, 50, "", 1000, 50},
		{"output past the reservation", gpt, 10, 51, "completion_tokens", 10, 50},
		{"the window exactly", gpt, 127_950, 50, "", 127_950, 50},
		{"past the window", gpt, 127_951, 50, "prompt_tokens", 127_950, 50},
		{"negative input", gpt, -1, 0, "prompt_tokens", 0, 0},
		{"negative output", gpt, 0, -1, "completion_tokens", 0, 0},
		{"a batch reserves past the window", batch, 200_000, 40_000, "", 200_000, 40_000},
		{"unknown model at its maximum", unknown, rule.MaxUnknownModelUsage - 10, 10, "", rule.MaxUnknownModelUsage - 10, 10},
		{"unknown model past its maximum", unknown, rule.MaxUnknownModelUsage, 10, "prompt_tokens", rule.MaxUnknownModelUsage - 10, 10},
		{"the attack", gpt, 1_000_000_000, 1_000_000_000, "completion_tokens", 127_950, 50},
		{"int64 extremes", gpt, math.MaxInt64, math.MaxInt64, "completion_tokens", 127_950, 50},
	}
	for _, tt := range tests {
		err := tt.b.Check(tt.in, tt.out)
		var ue *rule.UsageError
		switch {
		case tt.field == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.field != "" && (!errors.As(err, &ue) || ue.Field != tt.field || !errors.Is(err, rule.ErrUsageOutOfBounds)):
			t.Errorf("%s: %v, want a *UsageError on %s", tt.name, err, tt.field)
		}
		cin, cout, clamped := tt.b.Clamp(tt.in, tt.out)
		if cin != tt.cin || cout != tt.cout || clamped != (tt.field != "") {
			t.Errorf("%s: clamped to %d/%d (%v), want %d/%d", tt.name, cin, cout, clamped, tt.cin, tt.cout)
		}
		if tt.b.Check(cin, cout) != nil {
			t.Errorf("%s: the clamped usage %d/%d is still out of bounds", tt.name, cin, cout)
		}
	}
}

// TestUsageBoundsSaturate: a reservation whose counts add past int64, or
// are negative, still makes a bound (saturated, or at 0), never a wrapped
// one that would refuse every usage.
func TestUsageBoundsSaturate(t *testing.T) {
	t.Parallel()
	if b := rule.UsageBounds(128_000, math.MaxInt64, 1); b.MaxTotal != math.MaxInt64 || b.MaxOutput != 1 {
		t.Errorf("saturated: %+v", b)
	}
	if b := rule.UsageBounds(128_000, -5, -5); b.MaxTotal != 128_000 || b.MaxOutput != 0 {
		t.Errorf("negative reservation: %+v", b)
	}
}
