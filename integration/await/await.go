// Package await waits, in tests, for a condition the test can observe but
// is not told of: a row a goroutine of the code under test writes, a gauge,
// a listener that closes, a container that comes back. It looks every
// few milliseconds up to a bound, so a test takes as long as the system
// does and no longer, and fails with what it waited for instead of
// guessing a duration with time.Sleep.
//
// Where the code can tell the test (a test signal, a channel the test
// owns), wait on that instead; polling is for what happens outside.
//
// It is for tests only, like integration/pgtest; it imports nothing of the
// module.
package await

import (
	"testing"
	"time"
)

// Tick is how often For and Until look by default.
const Tick = 10 * time.Millisecond

// For calls ok at once and then every interval (Tick if interval is 0)
// until it returns true or timeout has passed, and reports whether it did.
func For(timeout, interval time.Duration, ok func() bool) bool {
	if interval <= 0 {
		interval = Tick
	}
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for !ok() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// Until is For that fails tb, naming what it waited for, when ok does not
// hold within timeout; state, if not nil, describes what was last seen.
func Until(tb testing.TB, timeout time.Duration, what string, ok func() bool, state func() string) {
	tb.Helper()
	UntilEvery(tb, timeout, 0, what, ok, state)
}

// UntilEvery is Until looking every interval: for a condition that is
// costly to look at (a cluster's members over HTTP, a query).
func UntilEvery(tb testing.TB, timeout, interval time.Duration, what string, ok func() bool, state func() string) {
	tb.Helper()
	if For(timeout, interval, ok) {
		return
	}
	s := ""
	if state != nil {
		s = ": " + state()
	}
	tb.Fatalf("timed out after %s waiting for %s%s", timeout, what, s)
}
