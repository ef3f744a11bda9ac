package budget_test

import (
	"math"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget"
)

// TestRetryAfterRoundsUpAndIsNeverZero: the faces used to round the same
// wait three ways, two of which could answer 0 ("retry now") for a refusal.
func TestRetryAfterRoundsUpAndIsNeverZero(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		d       time.Duration
		ms, sec int64
	}{
		{0, 1, 1},
		{-time.Second, 1, 1},
		{time.Nanosecond, 1, 1},
		{999 * time.Microsecond, 1, 1},
		{time.Millisecond, 1, 1},
		{1001 * time.Microsecond, 2, 1},
		{500 * time.Millisecond, 500, 1},
		{time.Second, 1000, 1},
		{time.Second + time.Nanosecond, 1001, 2},
		{90 * time.Second, 90000, 90},
		{time.Duration(math.MaxInt64), 9223372036855, 9223372037},
	} {
		if ms, sec := budget.RetryAfterMillis(c.d), budget.RetryAfterSeconds(c.d); ms != c.ms || sec != c.sec {
			t.Errorf("%v: %d ms, %d s; want %d ms, %d s", c.d, ms, sec, c.ms, c.sec)
		}
	}
}
