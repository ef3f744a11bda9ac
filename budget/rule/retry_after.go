package rule

import (
	"math"
	"time"
)

// NeverRefills is the wait of a refusal that refill cannot end within the
// range of a time.Duration (about 292 years): a bucket refilling a
// millionth of a token a second towards a large deficit. Every wait
// computed from a refill saturates at it instead of wrapping around, and
// the faces say "never" rather than promising a time: no Retry-After, no
// reset header, and a body that says only a refund or a change of the
// limits makes room.
const NeverRefills = time.Duration(math.MaxInt64)

// Never reports whether d is NeverRefills (or beyond what a refill can
// promise: within a millisecond of it).
func Never(d time.Duration) bool { return d > NeverRefills-time.Millisecond }

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
