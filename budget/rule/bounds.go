package rule

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// MaxUnknownModelUsage is the most tokens, input plus output, that a settle
// may report for a model the table does not know (twice the unknown
// model's assumed context window of 1,000,000 tokens): no known provider
// serves more in one request, and with a weight of at most 1000 it keeps
// any one settle's charge far from the edges of int64.
const MaxUnknownModelUsage = 2_000_000

// ErrUsageOutOfBounds is wrapped by *UsageError: a settle reported usage
// that no request could have produced. Nothing is charged.
var ErrUsageOutOfBounds = errors.New("budget: usage out of bounds")

// UsageError names the usage field that is out of bounds and why.
type UsageError struct {
	// Field is "prompt_tokens", "completion_tokens",
	// "prompt_tokens_details.cached_tokens" or
	// "completion_tokens_details.reasoning_tokens" (OpenAI's names), or
	// "cache_creation_input_tokens" (Anthropic's).
	Field  string
	Reason string
	// Bound is the largest value the field could have had.
	Bound int64
}

func (e *UsageError) Error() string { return "budget: usage." + e.Field + ": " + e.Reason }

// Unwrap makes errors.Is(err, ErrUsageOutOfBounds) true.
func (e *UsageError) Unwrap() error { return ErrUsageOutOfBounds }

// ErrOverflow is wrapped by *OverflowError: an amount's arithmetic would
// leave int64. Nothing is changed.
var ErrOverflow = errors.New("budget: amount out of range")

// OverflowError names the amount whose arithmetic overflowed.
type OverflowError struct {
	Field string
	Op    string // what was being computed
}

func (e *OverflowError) Error() string {
	return fmt.Sprintf("budget: %s: %s is out of range", e.Field, e.Op)
}

// Unwrap makes errors.Is(err, ErrOverflow) true.
func (e *OverflowError) Unwrap() error { return ErrOverflow }

// ErrDebtFloor: an admin debit would take the balance below the debt floor,
// minus one tokens capacity. Settles stop at the floor instead.
var ErrDebtFloor = errors.New("budget: the balance would go below the debt floor (minus one tokens capacity)")

// Add64 is a + b, and whether it fits int64.
func Add64(a, b int64) (int64, bool) {
	s := a + b
	if (b > 0 && s < a) || (b < 0 && s > a) {
		return 0, false
	}
	return s, true
}

// Sub64 is a - b, and whether it fits int64.
func Sub64(a, b int64) (int64, bool) {
	s := a - b
	if (b > 0 && s > a) || (b < 0 && s < a) {
		return 0, false
	}
	return s, true
}

// mul64 is a * b, and whether it fits int64.
func mul64(a, b int64) (int64, bool) {
	if a == 0 || b == 0 {
		return 0, true
	}
	neg := (a < 0) != (b < 0)
	ua, ub := absU(a), absU(b)
	hi, lo := bits.Mul64(ua, ub)
	if hi != 0 {
		return 0, false
	}
	if neg {
		if lo > 1<<63 {
			return 0, false
		}
		return int64(-lo), true // lo <= 2^63, checked above
	}
	if lo > math.MaxInt64 {
		return 0, false
	}
	return int64(lo), true
}

func absU(a int64) uint64 {
	if a < 0 {
		return uint64(-(a + 1)) + 1
	}
	return uint64(a)
}

// micro is n tokens in micro-units, or an *OverflowError naming field.
func micro(field string, n int64) (int64, error) {
	v, ok := mul64(n, Micro)
	if !ok {
		return 0, &OverflowError{Field: field, Op: fmt.Sprintf("%d tokens in micro-units", n)}
	}
	return v, nil
}

// AddMicro is a + b, or an *OverflowError naming field.
func AddMicro(field string, a, b int64) (int64, error) {
	v, ok := Add64(a, b)
	if !ok {
		return 0, &OverflowError{Field: field, Op: fmt.Sprintf("%d + %d", a, b)}
	}
	return v, nil
}
