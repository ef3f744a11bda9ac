package replica_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/await"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// A dead replica's lease is swept within TTL/2 of its expiry (bound 3)
// even while this replica's top-up is stuck: here three holders' renews
// wait for their tenants' row locks, which another transaction holds, for
// up to TTL/2 each. The sweep used to share the top-up's loop, so it waited
// behind them, and then for the loop's select to pick it over the next
// top-up: measured here, 1.1 to 3.2 s where it now takes 0.6 to 0.8 s
// (within TTL/2 and its own work). The window, TTL/2 + 750 ms, leaves room
// for a busy machine; the old loop failed it in one run of three.
func TestLeaseSweepNotHeldByTopUp(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second // real time: Run's tickers
	ctx := context.Background()
	now := &atomic.Int64{}
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()).UTC() }
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, func(c *pgxpool.Config) { c.MaxConns = 8 })
	r, err := replica.New(replica.Config{DB: pool, Store: account.NewStore(pool).WithClock(clock),
		Leasing: replica.LeaseConfig{Holder: "a", TTL: ttl, MinSlice: minSlice, NowFunc: clock, ClockFunc: clock}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { r.Leases.Run(rctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; r.Close() })
	hot := []string{"hot1", "hot2", "hot3", "hot4"}
	for _, id := range append([]string{"dead"}, hot...) {
		if _, err := r.Store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: rule.Limits{TokensCapacity: 10_000, TokensRateMicro: tok}}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Admin.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: id, Mode: lease.ModeAuto}); err != nil {
			t.Fatal(err)
		}
	}
	// A lease nobody renews: its holder is gone.
	dead, err := r.Leases.Store().Take(ctx, lease.TakeParams{TenantID: "dead", WantMicro: 100 * tok, MinMicro: 1})
	if err != nil {
		t.Fatal(err)
	}
	now.Add(int64(100 * time.Millisecond))
	// This replica's holders of the hot tenants: an admission each (exact)
	// wakes the top-up, which takes their leases.
	for _, id := range hot {
		if _, _, err := r.Admitter.Reserve(ctx, req(id, 10)); err != nil {
			t.Fatal(err)
		}
	}
	var live int
	if !await.For(10*time.Second, 20*time.Millisecond, func() bool {
		err := pool.QueryRow(ctx, `SELECT count(*) FROM leases WHERE state = 'live' AND tenant_id LIKE 'hot%'`).Scan(&live)
		return err == nil && live == len(hot)
	}) {
		t.Fatalf("%d live leases of the hot tenants, want %d", live, len(hot))
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM tenants WHERE id LIKE 'hot%' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	// The dead lease past its expiry; the hot ones within TTL/2 of theirs,
	// so the top-up renews them, and waits for their locks.
	now.Add(int64(ttl - 50*time.Millisecond))
	var waiting int
	if !await.For(10*time.Second, 10*time.Millisecond, func() bool {
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&waiting)
		return err == nil && waiting > 0
	}) {
		t.Fatal("no top-up waits for a hot tenant's lock")
	}
	var state string
	if !await.For(ttl/2+750*time.Millisecond, 10*time.Millisecond, func() bool {
		err := pool.QueryRow(ctx, `SELECT state FROM leases WHERE id = $1`, dead.ID).Scan(&state)
		return err == nil && state == "expired"
	}) {
		t.Fatalf("the dead lease is %s %s after its expiry, with the top-up stuck; want expired within a sweep (%s) and its work", state, ttl/2+750*time.Millisecond, ttl/2)
	}
}
