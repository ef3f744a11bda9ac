package outage_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/rule"
)

// TestReplaySkewIsNotTheReplaysWait: a replay moves a local admission's
// times by the skew between the replica's clock and the store's, read
// together; the time the replay waited before the store read its clock
// (for a connection while the store comes back, for the tenant's lock,
// between retries) is no skew. Both clocks are frozen and move only when
// the test moves them: the store's is the true time, the replica's runs an
// hour ahead; the replica admits on its own, the outage lasts 10 s, and
// the replay then waits 5 s for a connection (the pool's PrepareConn moves
// the clocks on). The admission lands at the store's time it was made, to
// the microsecond, and expires one TTL after it. (A replay that read the
// replica's clock when it was sent counted the 5 s as skew, and moved both
// 5 s later: the soak's "loc" admission made 1.4 s after its request.)
func TestReplaySkewIsNotTheReplaysWait(t *testing.T) {
	t.Parallel()
	const ahead, outageFor, wait, ttl = time.Hour, 10 * time.Second, 5 * time.Second, time.Minute
	var mu sync.Mutex
	truth := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	storeClock := func() time.Time { mu.Lock(); defer mu.Unlock(); return truth }
	replicaClock := func() time.Time { return storeClock().Add(ahead) }
	advance := func(d time.Duration) { mu.Lock(); truth = truth.Add(d); mu.Unlock() }
	var waiting atomic.Bool // the next connection the pool hands out took `wait`
	b := setupWith(t, rule.Limits{TokensCapacity: 1000, TokensRateMicro: rule.Micro, MaxConcurrent: 5, ReservationTTL: ttl}, 1,
		func(c *pgxpool.Config) {
			c.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) {
				if waiting.Swap(false) {
					advance(wait)
				}
				return true, nil
			}
		}, storeClock)
	b.local.NowFunc = replicaClock

	made := storeClock()
	r, err := b.local.Reserve(b.snap, rp(est(10), ""))
	if err != nil {
		t.Fatal(err)
	}
	advance(outageFor)
	waiting.Store(true)
	rep, err := b.local.Replay(ctx, b.store)
	if err != nil || rep.Reserved != 1 {
		t.Fatalf("replay: %+v, %v", rep, err)
	}
	if waiting.Load() {
		t.Fatal("the replay took no connection from the pool: the wait was never simulated")
	}
	var created, expires time.Time
	if err := b.store.Pool().QueryRow(ctx, `SELECT created_at, expires_at FROM admissions WHERE id = $1`, r.AdmissionID).Scan(&created, &expires); err != nil {
		t.Fatal(err)
	}
	if !created.Equal(made) || !expires.Equal(made.Add(ttl)) {
		t.Fatalf("created %s, expires %s; made at %s by the store's clock, so want %s and %s (the replay waited %s, the replica runs %s ahead)",
			created.UTC(), expires.UTC(), made, made, made.Add(ttl), wait, ahead)
	}
}
