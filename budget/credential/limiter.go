// Limiting failed authentication. Only failures spend; a bucket (an
// address, or an address and a key id) checks it has one left before any
// database lookup, so guessing keys or tokens cannot exhaust the service.

package credential

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limiter is a token bucket of failures per address. Addresses idle for ten
// minutes are forgotten, so the map stays small. It is safe for concurrent
// use.
type Limiter struct {
	mu      sync.Mutex
	perSec  rate.Limit
	burst   int
	clients map[string]*entry
	swept   time.Time
}

type entry struct {
	lim  *rate.Limiter
	seen time.Time
}

// NewLimiter returns a limiter allowing burst failures, refilled at perSecond.
func NewLimiter(perSecond float64, burst int) *Limiter {
	return &Limiter{perSec: rate.Limit(perSecond), burst: burst, clients: map[string]*entry{}}
}

func (l *Limiter) entry(addr string, now time.Time) *entry {
	if now.Sub(l.swept) > time.Minute {
		for k, e := range l.clients {
			if now.Sub(e.seen) > 10*time.Minute {
				delete(l.clients, k)
			}
		}
		l.swept = now
	}
	e, ok := l.clients[addr]
	if !ok {
		e = &entry{lim: rate.NewLimiter(l.perSec, l.burst)}
		l.clients[addr] = e
	}
	e.seen = now
	return e
}

// Allow reports whether addr has a failure left to spend. It spends
// nothing: a successful attempt costs the address nothing.
func (l *Limiter) Allow(addr string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	return l.entry(addr, now).lim.TokensAt(now) >= 1
}

// Fail spends one of addr's failures.
func (l *Limiter) Fail(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	l.entry(addr, now).lim.AllowN(now, 1)
}

// RetryAfter is how long one failure takes to refill, rounded up to whole
// seconds (at least one).
func (l *Limiter) RetryAfter() time.Duration {
	if l.perSec <= 0 {
		return time.Hour
	}
	return time.Duration(math.Ceil(1/float64(l.perSec))) * time.Second
}
