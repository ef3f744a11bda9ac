package budget

import (
	"errors"
	"fmt"
	"math"
	"math/bits"

	"github.com/tokengate/tokengate/estimator"
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

// UsageBounds is the most usage a settle of an admission that reserved e
// may report: output up to the output it reserved, and input plus output
// up to the model's widest context window in t (or the reservation, if
// larger: a batch of prompts or n > 1 reserves for several sequences).
// The widest: a call of a model that offers Anthropic's 1M-context beta
// may have carried it (estimator.Model.WidestContextWindow), and an
// admission does not record whether it did. The counts are raw tokens,
// before any cache weight (SettleParams.Usage weighs them after). A model t
// does not know is held to MaxUnknownModelUsage. A nil t is the seeded
// table.
func UsageBounds(e estimator.Estimate, t *estimator.Table) (maxOutput, maxTotal int64) {
	if t == nil {
		t = estimator.DefaultTable()
	}
	window := int64(MaxUnknownModelUsage)
	if m, known := t.Lookup(e.Model); known {
		window = m.WidestContextWindow()
	}
	reserved, ok := add64(max(e.InputTokens, 0), max(e.OutputTokens, 0))
	if !ok {
		reserved = math.MaxInt64
	}
	return max(e.OutputTokens, 0), max(window, reserved)
}

// CheckUsage returns a *UsageError (ErrUsageOutOfBounds) when in and out
// are not usage a request reserved as e could have produced (UsageBounds),
// or are negative; nil otherwise.
func CheckUsage(e estimator.Estimate, t *estimator.Table, in, out int64) error {
	maxOut, maxTotal := UsageBounds(e, t)
	switch {
	case in < 0:
		return &UsageError{Field: "prompt_tokens", Reason: "must not be negative", Bound: maxTotal}
	case out < 0:
		return &UsageError{Field: "completion_tokens", Reason: "must not be negative", Bound: maxOut}
	case out > maxOut:
		return &UsageError{Field: "completion_tokens", Bound: maxOut,
			Reason: fmt.Sprintf("%d exceeds the %d output tokens the admission reserved", out, maxOut)}
	case in > maxTotal-out:
		return &UsageError{Field: "prompt_tokens", Bound: maxTotal - out,
			Reason: fmt.Sprintf("%d input plus %d output tokens exceed the model's context window of %d tokens", in, out, maxTotal)}
	}
	return nil
}

// ClampUsage brings in and out within the bounds of CheckUsage (output
// first, then input), for usage that is a fact rather than a claim: the
// proxy's upstream already ran the request. clamped says whether anything
// changed.
func ClampUsage(e estimator.Estimate, t *estimator.Table, in, out int64) (int64, int64, bool) {
	maxOut, maxTotal := UsageBounds(e, t)
	cin, cout := min(max(in, 0), maxTotal), min(max(out, 0), maxOut)
	cin = min(cin, maxTotal-cout)
	return cin, cout, cin != in || cout != out
}

// CheckUsage is CheckUsage with the store's model table (WithModels).
func (s *Store) CheckUsage(e estimator.Estimate, in, out int64) error {
	return CheckUsage(e, s.modelTable(), in, out)
}

// WithModels gives the store the model table that bounds settles' usage
// (the estimator's, which admins may change at run time), and returns it.
// Without it the seeded table applies.
func (s *Store) WithModels(table func() *estimator.Table) *Store {
	s.modelsFunc = table
	return s
}

func (s *Store) modelTable() *estimator.Table {
	if s.modelsFunc == nil {
		return nil
	}
	return s.modelsFunc()
}

// add64 is a + b, and whether it fits int64.
func add64(a, b int64) (int64, bool) {
	s := a + b
	if (b > 0 && s < a) || (b < 0 && s > a) {
		return 0, false
	}
	return s, true
}

// sub64 is a - b, and whether it fits int64.
func sub64(a, b int64) (int64, bool) {
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

// addMicro is a + b, or an *OverflowError naming field.
func addMicro(field string, a, b int64) (int64, error) {
	v, ok := add64(a, b)
	if !ok {
		return 0, &OverflowError{Field: field, Op: fmt.Sprintf("%d + %d", a, b)}
	}
	return v, nil
}
