package account

import (
	"fmt"
	"math"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

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
	window := int64(rule.MaxUnknownModelUsage)
	if m, known := t.Lookup(e.Model); known {
		window = m.WidestContextWindow()
	}
	reserved, ok := rule.Add64(max(e.InputTokens, 0), max(e.OutputTokens, 0))
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
		return &rule.UsageError{Field: "prompt_tokens", Reason: "must not be negative", Bound: maxTotal}
	case out < 0:
		return &rule.UsageError{Field: "completion_tokens", Reason: "must not be negative", Bound: maxOut}
	case out > maxOut:
		return &rule.UsageError{Field: "completion_tokens", Bound: maxOut,
			Reason: fmt.Sprintf("%d exceeds the %d output tokens the admission reserved", out, maxOut)}
	case in > maxTotal-out:
		return &rule.UsageError{Field: "prompt_tokens", Bound: maxTotal - out,
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
