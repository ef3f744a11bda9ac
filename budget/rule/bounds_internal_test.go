package rule

import (
	"errors"
	"math"
	"testing"
	"time"
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
		if got, ok := Add64(tt.a, tt.b); ok != tt.addOK || (ok && got != tt.add) {
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
