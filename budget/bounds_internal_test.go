package budget

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tokengate/tokengate/estimator"
)

func TestCheckedArithmetic(t *testing.T) {
	t.Parallel()
	tests := []struct {
		a, b         int64
		add, mul     int64
		addOK, mulOK bool
	}{
		{2, 3, 5, 6, true, true},
		{math.MaxInt64, 1, 0, math.MaxInt64, false, true},
		{math.MinInt64, -1, 0, 0, false, false},
		{math.MinInt64, 1, math.MinInt64 + 1, math.MinInt64, true, true},
		{1 << 62, 2, 1<<62 + 2, 0, true, false},
		{-(1 << 62), 2, -(1 << 62) + 2, math.MinInt64, true, true},
		{3_037_000_500, 3_037_000_500, 6_074_001_000, 0, true, false},
		{-7, 0, -7, 0, true, true},
	}
	for _, tt := range tests {
		if got, ok := add64(tt.a, tt.b); ok != tt.addOK || (ok && got != tt.add) {
			t.Errorf("add64(%d, %d) = %d %v", tt.a, tt.b, got, ok)
		}
		if got, ok := mul64(tt.a, tt.b); ok != tt.mulOK || (ok && got != tt.mul) {
			t.Errorf("mul64(%d, %d) = %d %v", tt.a, tt.b, got, ok)
		}
	}
	if _, err := micro("cost", math.MaxInt64/Micro+1); !errors.Is(err, ErrOverflow) {
		t.Errorf("micro past int64: %v", err)
	}
}

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
		{"unknown model at its maximum", unknown, MaxUnknownModelUsage - 10, 10, "", MaxUnknownModelUsage - 10, 10},
		{"unknown model past its maximum", unknown, MaxUnknownModelUsage, 10, "prompt_tokens", MaxUnknownModelUsage - 10, 10},
		{"the attack", gpt, 1_000_000_000, 1_000_000_000, "completion_tokens", 127_950, 50},
		{"int64 extremes", gpt, math.MaxInt64, math.MaxInt64, "completion_tokens", 127_950, 50},
	}
	for _, tt := range tests {
		err := CheckUsage(tt.e, nil, tt.in, tt.out)
		var ue *UsageError
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

func TestBucketRefundStopsAtTheFloor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                 string
		balance, amount      int64
		wantApplied, wantBal int64
	}{
		{"charge to the floor", 50, -150, -150, -100},
		{"charge past the floor stops there", 50, -1000, -150, -100},
		{"below the floor already: no charge", -150, -10, 0, -150},
		{"the smallest charge", 0, math.MinInt64, -100, -100},
		{"the largest refund", 0, math.MaxInt64, 100, 100},
		{"refund from far below", math.MinInt64 + 5, math.MaxInt64, math.MaxInt64, 4},
	}
	for _, tt := range tests {
		b := Bucket{CapacityMicro: 100, BalanceMicro: tt.balance}
		if applied := b.Refund(tt.amount); applied != tt.wantApplied || b.BalanceMicro != tt.wantBal {
			t.Errorf("%s: applied %d balance %d, want %d %d", tt.name, applied, b.BalanceMicro, tt.wantApplied, tt.wantBal)
		}
	}
}

func TestTenantStateArithmeticErrs(t *testing.T) {
	t.Parallel()
	l := Limits{TokensCapacity: 100, TokensRateMicro: 1, PeriodBudget: 100, Period: PeriodDay}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	s := TenantState{Limits: l, Tokens: Bucket{CapacityMicro: 100 * Micro, BalanceMicro: 100 * Micro}}
	s.Advance(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	start := s.Tokens
	if _, err := s.Debit(math.MaxInt64 / 2); !errors.Is(err, ErrOverflow) {
		t.Fatalf("debit of MaxInt64/2: %v", err)
	}
	if _, err := s.End(0, math.MaxInt64/2, s.Tokens.At, false); !errors.Is(err, ErrOverflow) {
		t.Fatalf("end with an actual of MaxInt64/2: %v", err)
	}
	s.Windows[0].Used = math.MaxInt64 - 1
	if _, err := s.End(0, 10, s.Tokens.At, false); !errors.Is(err, ErrOverflow) {
		t.Fatalf("period past int64: %v", err)
	}
	if s.Tokens != start || s.Open != 0 || s.Windows[0].Used != math.MaxInt64-1 {
		t.Fatalf("a refused change moved the state: %+v", s)
	}
}

// Postgres' bigint arithmetic fails past int64 (SQLSTATE 22003) instead
// of wrapping: the store reports it as ErrOverflow, never as an outage.
func TestClassifyOutOfRange(t *testing.T) {
	t.Parallel()
	err := classify(&pgconn.PgError{Code: "22003", Message: "bigint out of range"}, false, false)
	var oe *OverflowError
	if !errors.As(err, &oe) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("22003: %v", err)
	}
}
