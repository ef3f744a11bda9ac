package rule

import (
	"math"
	"math/bits"
	"time"
)

// Micro is the fixed-point scale of token and request balances and rates.
const Micro = 1_000_000

// mulDivFloor returns floor(a*b/d) for non-negative a, b and positive d,
// saturating at math.MaxInt64 instead of overflowing.
func mulDivFloor(a, b, d int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(d) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(d))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// mulDivCeil returns ceil(a*b/d) for non-negative a, b and positive d,
// saturating at math.MaxInt64.
func mulDivCeil(a, b, d int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(d) {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, uint64(d))
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// Bucket is one refilling balance (tokens or requests) in micro-units. The
// store keeps one per tenant in its row; a replica under the local failure
// policy keeps its share in memory.
type Bucket struct {
	CapacityMicro int64
	RateMicro     int64 // micro-units per second
	BalanceMicro  int64
	At            time.Time
}

// Refill brings the bucket to now and returns what it added. Elapsed time is
// clamped at zero and the timestamp never moves backwards, so a clock that
// steps back can delay refill but never grant it twice. The balance never
// rises above capacity by refill, and a balance already above capacity (the
// capacity was lowered) is left alone.
func (b *Bucket) Refill(now time.Time) int64 {
	if !now.After(b.At) {
		return 0
	}
	elapsed := now.Sub(b.At).Microseconds()
	b.At = now
	if b.BalanceMicro >= b.CapacityMicro {
		return 0
	}
	add := mulDivFloor(b.RateMicro, elapsed, Micro)
	if room := b.CapacityMicro - b.BalanceMicro; add > room {
		add = room
	}
	b.BalanceMicro += add
	return add
}

// TimeUntil returns how long the bucket needs to hold needMicro, exactly,
// rounded up to the microsecond.
func (b *Bucket) TimeUntil(needMicro int64) time.Duration {
	deficit := needMicro - b.BalanceMicro
	if deficit <= 0 {
		return 0
	}
	us := mulDivCeil(deficit, Micro, b.RateMicro)
	if us > int64(math.MaxInt64/time.Microsecond) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(us) * time.Microsecond
}

// TimeUntilFull is how long the bucket needs to refill to capacity.
func (b *Bucket) TimeUntilFull() time.Duration { return b.TimeUntil(b.CapacityMicro) }

// Refund adds amount (which may be negative: an extra charge) and returns
// the effective change. A refund stops at capacity, or at the balance it
// started from if that was already above capacity; a charge may drive the
// balance negative, but stops at the debt floor, minus one capacity (or at
// the balance it started from if that was already below the floor). Neither
// can overflow.
func (b *Bucket) Refund(amountMicro int64) int64 {
	if amountMicro <= 0 {
		room, ok := Sub64(b.BalanceMicro, b.Floor())
		applied := amountMicro
		switch {
		case ok && room <= 0:
			applied = 0
		case ok && amountMicro < -room:
			applied = -room
		}
		b.BalanceMicro += applied
		return applied
	}
	room, ok := Sub64(max(b.CapacityMicro, b.BalanceMicro), b.BalanceMicro)
	applied := amountMicro
	if ok && room < applied {
		applied = room
	}
	b.BalanceMicro += applied
	return applied
}

// Floor is the debt floor of the bucket: minus one capacity. No charge
// takes a balance below it.
func (b *Bucket) Floor() int64 { return -b.CapacityMicro }

// Period is the calendar window of a period budget.
type Period string

// The periods, in UTC.
const (
	PeriodNone  Period = ""
	PeriodDay   Period = "day"
	PeriodMonth Period = "month"
)

// start returns the start of the window holding t, in UTC.
func (p Period) start(t time.Time) time.Time {
	t = t.UTC()
	switch p {
	case PeriodDay:
		return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	case PeriodMonth:
		return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
	return time.Time{}
}

// next returns the start of the window after the one starting at start.
func (p Period) next(start time.Time) time.Time {
	switch p {
	case PeriodDay:
		return start.AddDate(0, 0, 1)
	case PeriodMonth:
		return start.AddDate(0, 1, 0)
	}
	return time.Time{}
}

// RoundUpMS rounds d up to whole milliseconds, saturating at NeverRefills
// instead of wrapping to a negative wait (which the faces used to answer
// as "Retry-After: 1" and a reset in the past).
func RoundUpMS(d time.Duration) time.Duration {
	if Never(d) {
		return NeverRefills
	}
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d
}
