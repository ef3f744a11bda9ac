package account

import (
	"errors"
	"math"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

func TestUsageBounds(t *testing.T) {
	t.Parallel()
	gpt := estimator.Estimate{Model: "gpt-4o-2024-08-06", InputTokens: 100, OutputTokens: 50}
	batch := estimator.Estimate{Model: "gpt-4o", InputTokens: 200_000, OutputTokens: 40_000} // a batch of prompts
	unknown := estimator.Estimate{Model: "no-such-model", InputTokens: 10, OutputTokens: 10}
	tests := []struct {
		name    string
		e       estimator.Estimate
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
		err := CheckUsage(tt.e, nil, tt.in, tt.out)
		var ue *rule.UsageError
		switch {
		case tt.field == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.field != "" && (!errors.As(err, &ue) || ue.Field != tt.field):
			t.Errorf("%s: %v, want a *UsageError on %s", tt.name, err, tt.field)
		}
		cin, cout, clamped := ClampUsage(tt.e, nil, tt.in, tt.out)
		if cin != tt.cin || cout != tt.cout || clamped != (tt.field != "") {
			t.Errorf("%s: clamped to %d/%d (%v), want %d/%d", tt.name, cin, cout, clamped, tt.cin, tt.cout)
		}
		if CheckUsage(tt.e, nil, cin, cout) != nil {
			t.Errorf("%s: the clamped usage %d/%d is still out of bounds", tt.name, cin, cout)
		}
	}
}

// Postgres' bigint arithmetic fails past int64 (SQLSTATE 22003) instead
// of wrapping: the store reports it as ErrOverflow, never as an outage.
func TestClassifyOutOfRange(t *testing.T) {
	t.Parallel()
	err := classify(&pgconn.PgError{Code: "22003", Message: "bigint out of range"}, false, false)
	var oe *rule.OverflowError
	if !errors.As(err, &oe) || errors.Is(err, rule.ErrUnavailable) {
		t.Fatalf("22003: %v", err)
	}
}
