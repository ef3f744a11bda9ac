package budget

import "time"

// RetryAfterMillis and RetryAfterSeconds are the wait a refusal tells its
// caller, in the unit of the face's header, rounded up and never zero: a
// zero reads as "retry now", and a caller that does is refused again. Every
// face (HTTP API, proxy, rate limit service) uses them, so that the same
// refusal tells the same wait whichever door it came through.
func RetryAfterMillis(d time.Duration) int64 { return max(1, ceilUnits(d, time.Millisecond)) }

// RetryAfterSeconds: see RetryAfterMillis.
func RetryAfterSeconds(d time.Duration) int64 { return max(1, ceilUnits(d, time.Second)) }

// ceilUnits is d in units, rounded up, without overflowing near the
// largest Duration.
func ceilUnits(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	q := int64(d / unit)
	if d%unit != 0 {
		q++
	}
	return q
}
