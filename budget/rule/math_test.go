package rule

import (
	"math"
	"testing"
	"time"
)

func TestBucketRefill(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name        string
		capacity    int64 // micro
		rate        int64 // micro per second
		balance     int64
		at, now     time.Time
		wantAdd     int64
		wantBalance int64
		wantAt      time.Time
	}{
		{"one second at 10/s", 100 * Micro, 10 * Micro, 0, t0, t0.Add(time.Second), 10 * Micro, 10 * Micro, t0.Add(time.Second)},
		{"fraction of a token", 100 * Micro, 10 * Micro, 0, t0, t0.Add(150 * time.Microsecond), 1500, 1500, t0.Add(150 * time.Microsecond)},
		{"fractional rate floors", 100 * Micro, 333_333, 0, t0, t0.Add(3 * time.Microsecond), 0, 0, t0.Add(3 * time.Microsecond)},
		{"fractional rate exact", 100 * Micro, 500_000, 0, t0, t0.Add(4 * time.Second), 2 * Micro, 2 * Micro, t0.Add(4 * time.Second)},
		{"capped at capacity", 100 * Micro, 10 * Micro, 95 * Micro, t0, t0.Add(time.Hour), 5 * Micro, 100 * Micro, t0.Add(time.Hour)},
		{"debt is paid back", 100 * Micro, 10 * Micro, -30 * Micro, t0, t0.Add(5 * time.Second), 50 * Micro, 20 * Micro, t0.Add(5 * time.Second)},
		{"clock behind: clamped, timestamp kept", 100 * Micro, 10 * Micro, 0, t0, t0.Add(-time.Second), 0, 0, t0},
		{"same instant", 100 * Micro, 10 * Micro, 7, t0, t0, 0, 7, t0},
		{"above capacity after a lowered limit", 100 * Micro, 10 * Micro, 150 * Micro, t0, t0.Add(time.Second), 0, 150 * Micro, t0.Add(time.Second)},
		{"years idle do not overflow", 1e12 * Micro, 1e9 * Micro, 0, t0, t0.Add(20 * 365 * 24 * time.Hour), 1e12 * Micro, 1e12 * Micro, t0.Add(20 * 365 * 24 * time.Hour)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := Bucket{CapacityMicro: tt.capacity, RateMicro: tt.rate, BalanceMicro: tt.balance, At: tt.at}
			if add := b.Refill(tt.now); add != tt.wantAdd || b.BalanceMicro != tt.wantBalance || !b.At.Equal(tt.wantAt) {
				t.Fatalf("refill: add %d balance %d at %s; want %d %d %s", add, b.BalanceMicro, b.At, tt.wantAdd, tt.wantBalance, tt.wantAt)
			}
		})
	}
}

func TestBucketTimeUntil(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		rate, balance int64
		need          int64
		want          time.Duration
	}{
		{"already there", 10 * Micro, 5 * Micro, 5 * Micro, 0},
		{"exact seconds", 10 * Micro, 0, 25 * Micro, 2500 * time.Millisecond},
		{"rounds up to the microsecond", 3 * Micro, 0, 1 * Micro, 333334 * time.Microsecond},
		{"from debt", 10 * Micro, -10 * Micro, 10 * Micro, 2 * time.Second},
	}
	for _, tt := range tests {
		b := Bucket{CapacityMicro: 100 * Micro, RateMicro: tt.rate, BalanceMicro: tt.balance}
		if got := b.TimeUntil(tt.need); got != tt.want {
			t.Errorf("%s: timeUntil = %s, want %s", tt.name, got, tt.want)
		}
	}
	if got := RoundUpMS(333334 * time.Microsecond); got != 334*time.Millisecond {
		t.Errorf("roundUpMS = %s", got)
	}
}

func TestBucketRefund(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                 string
		balance, amount      int64
		wantApplied, wantBal int64
	}{
		{"refund within room", 50, 20, 20, 70},
		{"refund capped at capacity", 90, 20, 10, 100},
		{"extra charge goes negative", 5, -20, -20, -15},
		{"above capacity: no refund", 120, 20, 0, 120},
		{"zero", 40, 0, 0, 40},
	}
	for _, tt := range tests {
		b := Bucket{CapacityMicro: 100, BalanceMicro: tt.balance}
		if applied := b.Refund(tt.amount); applied != tt.wantApplied || b.BalanceMicro != tt.wantBal {
			t.Errorf("%s: applied %d balance %d, want %d %d", tt.name, applied, b.BalanceMicro, tt.wantApplied, tt.wantBal)
		}
	}
}

func TestPeriodWindows(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 31, 23, 59, 59, 999999000, time.FixedZone("UTC+5", 5*3600))
	if got, want := PeriodDay.start(at), time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("day start %s, want %s (windows are UTC)", got, want)
	}
	if got, want := PeriodMonth.start(at), time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("month start %s, want %s", got, want)
	}
	if got, want := PeriodMonth.next(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)), time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("month next %s, want %s", got, want)
	}
	if got, want := PeriodDay.next(time.Date(2028, 2, 28, 0, 0, 0, 0, time.UTC)), time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("day next %s, want %s", got, want)
	}
}

func TestMulDiv(t *testing.T) {
	t.Parallel()
	if got := mulDivFloor(math.MaxInt64, math.MaxInt64, 1); got != math.MaxInt64 {
		t.Errorf("saturation: %d", got)
	}
	if got := mulDivFloor(7, 3, 2); got != 10 {
		t.Errorf("floor(21/2) = %d", got)
	}
	if got := mulDivCeil(7, 3, 2); got != 11 {
		t.Errorf("ceil(21/2) = %d", got)
	}
	if got := mulDivFloor(-1, 3, 2); got != 0 {
		t.Errorf("negative input: %d", got)
	}
}

func TestParseRate(t *testing.T) {
	t.Parallel()
	good := map[string]int64{"100": 100 * Micro, "2.5": 2_500_000, "0.000001": 1, ".5": 500_000, "7.": 7 * Micro}
	for in, want := range good {
		got, err := ParseRate(in)
		if err != nil || got != want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", in, got, err, want)
		}
		if back, _ := ParseRate(FormatRate(got)); back != got {
			t.Errorf("FormatRate(%d) = %q does not round-trip", got, FormatRate(got))
		}
	}
	for _, in := range []string{"", "-1", "+1", "1e3", "0.0000001", "abc", "1.2.3", "1.+5", "1.-5", "99999999999999999999"} {
		if _, err := ParseRate(in); err == nil {
			t.Errorf("ParseRate(%q) accepted", in)
		}
	}
}
