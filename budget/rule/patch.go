package rule

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"time"
)

// Bounds of a tenant's timing limits. They are checked on the milliseconds
// a client sends, before any conversion to a time.Duration, so that a huge
// value is refused rather than overflowing into a small one.
const (
	// MinReservationTTL is the shortest reservation lifetime a tenant may have.
	MinReservationTTL = time.Second
	// MaxReservationTTL is the longest reservation lifetime a tenant may have.
	MaxReservationTTL = 7 * 24 * time.Hour
	// MinMaxWait is the shortest wait cap a tenant may have.
	MinMaxWait = time.Millisecond
	// MaxMaxWait is the longest wait cap a tenant may have.
	MaxMaxWait = 10 * time.Minute
)

type changeState uint8

const (
	changeAbsent changeState = iota
	changeSet
	changeUnset
)

// Change is one field of a patch, in one of three states: absent (the zero
// value: the field keeps its value), Set(v), or Unset (JSON null: the
// optional limit is removed, or a timing limit goes back to its default).
type Change[T any] struct {
	state changeState
	value T
}

// Set is a change to v.
func Set[T any](v T) Change[T] { return Change[T]{state: changeSet, value: v} }

// Unset is a change that removes the value.
func Unset[T any]() Change[T] { return Change[T]{state: changeUnset} }

// Absent reports whether the field is left as it is.
func (c Change[T]) Absent() bool { return c.state == changeAbsent }

// IsUnset reports whether the field is removed.
func (c Change[T]) IsUnset() bool { return c.state == changeUnset }

// Value returns the value set, and whether one is.
func (c Change[T]) Value() (T, bool) { return c.value, c.state == changeSet }

// LimitsPatch is a partial change of a tenant's limits. Store.UpdateLimits
// applies it to the limits it reads under the tenant's row lock, so that
// concurrent patches of different fields never lose one another.
type LimitsPatch struct {
	TokensCapacity  Change[int64] // required: cannot be unset
	TokensRateMicro Change[int64] // required: cannot be unset
	// Unsetting either of the request bucket's fields removes the bucket.
	RequestsCapacity  Change[int64]
	RequestsRateMicro Change[int64]
	MaxConcurrent     Change[int64]
	// Unsetting either of the period budget's fields removes it.
	PeriodBudget Change[int64]
	Period       Change[Period]
	// ReservationTTLMS and MaxWaitMS are milliseconds; unset restores
	// DefaultReservationTTL and DefaultMaxWait.
	ReservationTTLMS Change[int64]
	MaxWaitMS        Change[int64]
	// OnStoreUnavailable unset defers to the server's default.
	OnStoreUnavailable Change[Policy]
	// Windows replaces the tenant's windows (null removes them all). A
	// window that keeps its name and calendar keeps what it used.
	Windows Change[[]WindowLimit]
	// Shadow unset is the empty set: every limit enforced.
	Shadow Change[LimitSet]
}

// Empty reports whether the patch changes nothing.
func (p LimitsPatch) Empty() bool {
	if !p.Windows.Absent() {
		return false
	}
	p.Windows = Change[[]WindowLimit]{}
	return reflect.DeepEqual(p, LimitsPatch{})
}

// Check validates each field of the patch on its own and returns a
// *LimitError (ErrInvalidLimits) naming the first bad one, in the API's
// field names. Rules across fields (a request bucket needs both its
// capacity and its rate) are checked by Limits.Validate on the result of
// Apply.
func (p LimitsPatch) Check() error {
	rateMax := int64(MaxAmount * Micro / 1000)
	for _, f := range []struct {
		name     string
		c        Change[int64]
		min, max int64
		unset    string // why it cannot be unset; "" when it can
		zero     string // the hint when 0 is sent
	}{
		{"tokens_capacity", p.TokensCapacity, 1, MaxAmount, "required: the token bucket cannot be removed", ""},
		{"tokens_per_second", p.TokensRateMicro, 1, rateMax, "required: the token bucket cannot be removed", ""},
		{"requests_capacity", p.RequestsCapacity, 1, MaxAmount, "", "null removes the request bucket"},
		{"requests_per_second", p.RequestsRateMicro, 1, rateMax, "", "null removes the request bucket"},
		{"max_concurrent", p.MaxConcurrent, 1, math.MaxInt32, "", "null removes the cap"},
		{"period_budget", p.PeriodBudget, 1, MaxAmount, "", "null removes the period budget"},
		{"reservation_ttl_ms", p.ReservationTTLMS, MinReservationTTL.Milliseconds(), MaxReservationTTL.Milliseconds(), "", "null restores the default"},
		{"max_wait_ms", p.MaxWaitMS, MinMaxWait.Milliseconds(), MaxMaxWait.Milliseconds(), "", "null restores the default"},
	} {
		if f.c.IsUnset() && f.unset != "" {
			return &LimitError{f.name, f.unset}
		}
		v, ok := f.c.Value()
		if !ok || v >= f.min && v <= f.max {
			continue
		}
		reason := fmt.Sprintf("must be between %d and %d", f.min, f.max)
		if f.name == "tokens_per_second" || f.name == "requests_per_second" {
			reason = fmt.Sprintf("must be between 0.000001 and %s", FormatRate(f.max))
		}
		if f.zero != "" {
			reason += " (" + f.zero + ")"
		}
		return &LimitError{f.name, reason}
	}
	if v, ok := p.Period.Value(); ok && v != PeriodDay && v != PeriodMonth {
		return &LimitError{"period", `must be "day" or "month" (null removes the period budget)`}
	}
	if v, ok := p.OnStoreUnavailable.Value(); ok && v != PolicyReject && v != PolicyLocal {
		return &LimitError{"on_store_unavailable", `must be "reject" or "local" (null defers to the server's default)`}
	}
	if v, ok := p.Shadow.Value(); ok && (v.Has(LimitInputTokens) || v.Has(LimitOutputTokens)) {
		return &LimitError{"shadow", "input_tokens and output_tokens are a model's limits: set them shadow in the tenant's model limits"}
	}
	switch {
	case p.RequestsCapacity.IsUnset() && !p.RequestsRateMicro.Absent() && !p.RequestsRateMicro.IsUnset():
		return &LimitError{"requests_per_second", "the request bucket is removed: requests_capacity is null"}
	case p.RequestsRateMicro.IsUnset() && !p.RequestsCapacity.Absent() && !p.RequestsCapacity.IsUnset():
		return &LimitError{"requests_capacity", "the request bucket is removed: requests_per_second is null"}
	case p.PeriodBudget.IsUnset() && !p.Period.Absent() && !p.Period.IsUnset():
		return &LimitError{"period", "the period budget is removed: period_budget is null"}
	case p.Period.IsUnset() && !p.PeriodBudget.Absent() && !p.PeriodBudget.IsUnset():
		return &LimitError{"period_budget", "the period budget is removed: period is null"}
	}
	return nil
}

// Apply returns l with the patch's changes. Call Check first: Apply does
// not validate.
func (p LimitsPatch) Apply(l Limits) Limits {
	set := func(dst *int64, c Change[int64]) {
		if v, ok := c.Value(); ok {
			*dst = v
		}
	}
	set(&l.TokensCapacity, p.TokensCapacity)
	set(&l.TokensRateMicro, p.TokensRateMicro)
	set(&l.RequestsCapacity, p.RequestsCapacity)
	set(&l.RequestsRateMicro, p.RequestsRateMicro)
	if p.RequestsCapacity.IsUnset() || p.RequestsRateMicro.IsUnset() {
		l.RequestsCapacity, l.RequestsRateMicro = 0, 0
	}
	set(&l.MaxConcurrent, p.MaxConcurrent)
	if p.MaxConcurrent.IsUnset() {
		l.MaxConcurrent = 0
	}
	if v, ok := p.Windows.Value(); ok {
		l.Windows, l.PeriodBudget, l.Period = slices.Clone(v), 0, PeriodNone
	} else if p.Windows.IsUnset() {
		l.Windows, l.PeriodBudget, l.Period = nil, 0, PeriodNone
	}
	set(&l.PeriodBudget, p.PeriodBudget)
	if v, ok := p.Period.Value(); ok {
		l.Period = v
	}
	if p.PeriodBudget.IsUnset() || p.Period.IsUnset() {
		// The period budget is the window named "period": removing it
		// removes that window.
		l.PeriodBudget, l.Period = 0, PeriodNone
		l.Windows = slices.DeleteFunc(slices.Clone(l.Windows), func(w WindowLimit) bool { return w.Name == PeriodWindowName })
	}
	if v, ok := p.ReservationTTLMS.Value(); ok {
		l.ReservationTTL = time.Duration(v) * time.Millisecond
	} else if p.ReservationTTLMS.IsUnset() {
		l.ReservationTTL = DefaultReservationTTL
	}
	if v, ok := p.MaxWaitMS.Value(); ok {
		l.MaxWait = time.Duration(v) * time.Millisecond
	} else if p.MaxWaitMS.IsUnset() {
		l.MaxWait = DefaultMaxWait
	}
	if v, ok := p.OnStoreUnavailable.Value(); ok {
		l.OnStoreUnavailable = v
	} else if p.OnStoreUnavailable.IsUnset() {
		l.OnStoreUnavailable = PolicyDefault
	}
	if v, ok := p.Shadow.Value(); ok {
		l.Shadow = v
	} else if p.Shadow.IsUnset() {
		l.Shadow = 0
	}
	return l
}
