package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const tok = rule.Micro // one token in micro-tokens

// replica is one replica's lease machinery on its own pool.
type replica struct {
	pool    *pgxpool.Pool
	acct    *account.Store
	leases  *lease.Store
	journal *lease.Journal
}

type testBundle struct {
	url string
	now *atomic.Int64 // the frozen clock, unix nanoseconds
	r   *replica      // the first replica
}

func (b *testBundle) clock() time.Time { return time.Unix(0, b.now.Load()).UTC() }

func (b *testBundle) advance(d time.Duration) { b.now.Add(int64(d)) }

func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{url: pgtest.URL(t), now: &atomic.Int64{}}
	b.now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	b.r = b.replica(t, "r0", 8)
	return b
}

// replica starts a replica on a pool of its own, with its journal running
// until the test ends.
func (b *testBundle) replica(t *testing.T, name string, conns int32) *replica {
	t.Helper()
	return b.replicaCapped(t, name, conns, 0)
}

// replicaCapped is replica with lease.Config.MaxUnusedPercent pct.
func (b *testBundle) replicaCapped(t *testing.T, name string, conns int32, pct int64) *replica {
	t.Helper()
	return b.replicaWith(t, name, conns, func(c *lease.Config) { c.MaxUnusedPercent = pct })
}

// replicaWith is replica with its lease.Config changed by config.
func (b *testBundle) replicaWith(t *testing.T, name string, conns int32, config func(*lease.Config)) *replica {
	t.Helper()
	pool := pgtest.Pool(t, b.url, func(c *pgxpool.Config) { c.MaxConns = conns })
	acct := account.NewStore(pool).WithClock(b.clock)
	c := lease.Config{Store: acct, Holder: name, TTL: 10 * time.Second, ClockFunc: b.clock}
	config(&c)
	ls, err := lease.New(c)
	if err != nil {
		t.Fatal(err)
	}
	j := lease.NewJournal(ls)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { j.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return &replica{pool: pool, acct: acct, leases: ls, journal: j}
}

// tenant creates a tenant in lease mode auto (a lease is taken only of
// one).
func (b *testBundle) tenant(t *testing.T, id, parent string, l rule.Limits) {
	t.Helper()
	b.tenantOff(t, id, parent, l)
	if _, err := b.r.leases.SetMode(context.Background(), lease.SetModeParams{TenantID: id, Mode: lease.ModeAuto}); err != nil {
		t.Fatal(err)
	}
}

// tenantOff creates a tenant in lease mode off, the default.
func (b *testBundle) tenantOff(t *testing.T, id, parent string, l rule.Limits) {
	t.Helper()
	if _, err := b.r.acct.CreateTenant(context.Background(), account.CreateTenantParams{ID: id, Parent: parent, Limits: l}); err != nil {
		t.Fatal(err)
	}
}

func (b *testBundle) balance(t *testing.T, id string) int64 {
	t.Helper()
	var v int64
	if err := b.r.pool.QueryRow(context.Background(), "SELECT tokens_micro FROM tenants WHERE id = $1", id).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// verify checks the tenant's chain, that its stored balance is the
// chain's, and the audit `ledger verify` runs, and returns the tally.
func (b *testBundle) verify(t *testing.T, id string) ledger.Tally {
	t.Helper()
	tally, err := ledger.Verify(context.Background(), b.r.pool, id)
	if err != nil {
		t.Fatalf("ledger verify %s: %v", id, err)
	}
	if got := b.balance(t, id); got != tally.BalanceMicro {
		t.Fatalf("%s: stored balance %d, the chain's %d", id, got, tally.BalanceMicro)
	}
	// What `tokengate ledger verify` runs: the chain, and the row's head
	// and balance against it.
	res, err := b.r.acct.Audit(context.Background(), id)
	if err != nil || len(res) != 1 || !res[0].OK || res[0].Entries != tally.Entries {
		t.Fatalf("audit %s: %+v, %v", id, res, err)
	}
	return tally
}

// kindSum is the count and the sum of deltas of a tenant's entries of a kind.
func (b *testBundle) kindSum(t *testing.T, id string, kind ledger.Kind) (n, delta, estimate int64) {
	t.Helper()
	err := b.r.pool.QueryRow(context.Background(),
		"SELECT count(*), coalesce(sum(delta_micro), 0), coalesce(sum(estimate), 0) FROM ledger_entries WHERE tenant_id = $1 AND kind = $2",
		id, string(kind)).Scan(&n, &delta, &estimate)
	if err != nil {
		t.Fatal(err)
	}
	return n, delta, estimate
}

func adm(id string, cost int64) lease.Admission {
	return lease.Admission{Admission: account.Admission{ID: id, Estimate: estimator.Estimate{Model: "gpt-4o", Cost: cost}}, CostMicro: cost * tok}
}

// A lease takes the same slice from every level of the tree (the poorest
// level's balance when it asks for more), each admission journaled from it
// becomes a reserve entry at every level that moves nothing, and a return
// gives back exactly what was not used: the chains verify.
func TestTakeReturnExact(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "org", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
	b.tenant(t, "acme", "org", rule.Limits{TokensCapacity: 500, TokensRateMicro: tok})

	l, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 800 * tok, MinMicro: 1})
	if err != nil {
		t.Fatal(err)
	}
	if l.SliceMicro != 500*tok || len(l.Levels) != 2 || l.Levels[0] != "org" || l.Levels[1] != "acme" {
		t.Fatalf("lease %+v: want a 500-token slice at org, acme", l)
	}
	if got := b.balance(t, "org"); got != 500*tok {
		t.Fatalf("org balance %d after the take, want %d", got, 500*tok)
	}
	if got := b.balance(t, "acme"); got != 0 {
		t.Fatalf("acme balance %d after the take, want 0", got)
	}
	for i, c := range []int64{50, 70, 30} {
		if err := b.r.journal.Append(ctx, l.ID, adm(fmt.Sprintf("a%d", i), c)); err != nil {
			t.Fatal(err)
		}
	}
	unused, err := b.r.leases.Return(ctx, l.ID)
	if err != nil {
		t.Fatal(err)
	}
	if unused != 350*tok {
		t.Fatalf("returned %d, want %d", unused, 350*tok)
	}
	for _, lv := range []struct {
		id   string
		want int64
	}{{"org", 850 * tok}, {"acme", 350 * tok}} {
		if got := b.balance(t, lv.id); got != lv.want {
			t.Errorf("%s balance %d after the return, want %d", lv.id, got, lv.want)
		}
		b.verify(t, lv.id)
		n, delta, est := b.kindSum(t, lv.id, ledger.KindReserve)
		if n != 3 || delta != 0 || est != 150 {
			t.Errorf("%s: %d reserve entries moving %d, estimates %d; want 3 moving 0, estimates 150", lv.id, n, delta, est)
		}
		if n, delta, _ := b.kindSum(t, lv.id, ledger.KindLeaseTake); n != 1 || delta != -500*tok {
			t.Errorf("%s: %d take entries moving %d; want 1 moving %d", lv.id, n, delta, -500*tok)
		}
		if n, delta, _ := b.kindSum(t, lv.id, ledger.KindLeaseReturn); n != 1 || delta != 350*tok {
			t.Errorf("%s: %d return entries moving %d; want 1 moving %d", lv.id, n, delta, 350*tok)
		}
	}
	// The lease is over: nothing more is journaled or returned from it.
	if err := b.r.journal.Append(ctx, l.ID, adm("late", 1)); !errors.Is(err, lease.ErrOver) {
		t.Errorf("append after the return: %v, want ErrOver", err)
	}
	if _, err := b.r.leases.Return(ctx, l.ID); !errors.Is(err, lease.ErrOver) {
		t.Errorf("second return: %v, want ErrOver", err)
	}
}

// A tenant whose tree has a rule only exact mode keeps is never leased,
// and the refused take moves nothing.
func TestExactOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "org", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok, MaxConcurrent: 4})
	b.tenant(t, "acme", "org", rule.Limits{TokensCapacity: 500, TokensRateMicro: tok})
	before := map[string]int64{"org": b.verify(t, "org").Entries, "acme": b.verify(t, "acme").Entries}
	_, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 100 * tok})
	var eo *lease.ExactOnlyError
	if !errors.As(err, &eo) || eo.TenantID != "org" || eo.Rule != "concurrency limit" || !errors.Is(err, lease.ErrExactOnly) {
		t.Fatalf("take: %v, want the exact-only error of org's concurrency limit", err)
	}
	for _, id := range []string{"org", "acme"} {
		if tally := b.verify(t, id); tally.Entries != before[id] {
			t.Errorf("%s: %d entries after a refused take, want the %d before it", id, tally.Entries, before[id])
		}
	}
	if _, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "nobody", WantMicro: tok}); !errors.Is(err, rule.ErrTenantNotFound) {
		t.Errorf("take of an unknown tenant: %v", err)
	}
	if _, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 0}); err == nil {
		t.Errorf("take of nothing: no error")
	}
}

// The journal keeps a lease's admissions within its slice in the database,
// whatever its holder believes, and refuses any past the lease's expiry by
// the store's clock.
func TestJournalBounds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
	l, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 100 * tok})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.r.journal.Append(ctx, l.ID, adm("a", 60)); err != nil {
		t.Fatal(err)
	}
	if err := b.r.journal.Append(ctx, l.ID, adm("b", 41)); !errors.Is(err, lease.ErrOver) {
		t.Fatalf("append past the slice: %v, want ErrOver", err)
	}
	if err := b.r.journal.Append(ctx, l.ID, adm("c", 40)); err != nil {
		t.Fatalf("append up to the slice: %v", err)
	}
	l2, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 100 * tok})
	if err != nil {
		t.Fatal(err)
	}
	b.advance(10 * time.Second) // the TTL: both leases are past their expiry
	if err := b.r.journal.Append(ctx, l2.ID, adm("d", 1)); !errors.Is(err, lease.ErrOver) {
		t.Fatalf("append at the expiry: %v, want ErrOver", err)
	}
	if _, err := b.r.leases.Renew(ctx, l2.ID, tok); !errors.Is(err, lease.ErrOver) {
		t.Fatalf("renew at the expiry: %v, want ErrOver", err)
	}
	n, err := b.r.leases.Sweep(ctx, 10)
	if err != nil || n != 2 {
		t.Fatalf("sweep: %d, %v; want 2 expired", n, err)
	}
	// 1000 - 100 - 100 + 10 s of refill at 1 token/s + 0 + 100 returned.
	if got, want := b.balance(t, "acme"), int64(1000-100-100+10+100)*tok; got != want {
		t.Fatalf("balance %d, want %d", got, want)
	}
	b.verify(t, "acme")
	if n, _, est := b.kindSum(t, "acme", ledger.KindReserve); n != 2 || est != 100 {
		t.Errorf("%d reserve entries for %d; want the 2 journaled, 100", n, est)
	}
}

// A holder that dies (stops renewing, never returns) holds its budget only
// until its lease's TTL: the sweeper then books what it admitted and gives
// the rest back, and another replica can lease it.
func TestDeadHolderGivesBackAtTTL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
	dead := lease.NewHolder(b.r.leases, b.r.journal, lease.HolderConfig{TenantID: "acme", SliceMicro: 300 * tok, NowFunc: b.clock})
	for i := range 4 {
		if err := dead.Admit(ctx, adm(fmt.Sprintf("d%d", i), 25)); err != nil {
			t.Fatal(err)
		}
	}
	if got := b.balance(t, "acme"); got != 700*tok {
		t.Fatalf("balance %d while the lease is held, want %d", got, 700*tok)
	}
	other := b.replica(t, "r1", 4)
	b.advance(9 * time.Second)
	if n, err := other.leases.Sweep(ctx, 10); err != nil || n != 0 {
		t.Fatalf("sweep before the TTL: %d, %v; want none expired", n, err)
	}
	b.advance(time.Second)
	if n, err := other.leases.Sweep(ctx, 10); err != nil || n != 1 {
		t.Fatalf("sweep at the TTL: %d, %v; want 1 expired", n, err)
	}
	// 700 + 10 s of refill + the 200 it did not use.
	if got, want := b.balance(t, "acme"), int64(700+10+200)*tok; got != want {
		t.Fatalf("balance %d after the sweep, want %d", got, want)
	}
	b.verify(t, "acme")
	if n, delta, est := b.kindSum(t, "acme", ledger.KindReserve); n != 4 || delta != 0 || est != 100 {
		t.Errorf("%d reserve entries moving %d for %d; want the 4 admitted, 0, 100", n, delta, est)
	}
	if n, delta, _ := b.kindSum(t, "acme", ledger.KindLeaseReturn); n != 1 || delta != 200*tok {
		t.Errorf("%d return entries moving %d; want 1 moving %d", n, delta, 200*tok)
	}
	// Another replica leases what came back.
	h := lease.NewHolder(other.leases, other.journal, lease.HolderConfig{TenantID: "acme", SliceMicro: 900 * tok, NowFunc: b.clock})
	if err := h.Admit(ctx, adm("o", 900)); err != nil {
		t.Fatalf("admit after the sweep: %v", err)
	}
	// The dead holder, were it to come back, learns its lease is over and
	// finds nothing left to lease.
	if err := dead.Admit(ctx, adm("zombie", 20)); !errors.Is(err, lease.ErrExhausted) {
		t.Fatalf("the dead holder's admission: %v, want ErrExhausted", err)
	}
}

// A lease ended while its journal is busy: every admission the journal
// accepted is booked in the ledger by the end, none is accepted after it,
// and the end gives back exactly the slice less what was accepted.
func TestEndWithAdmissionsInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 100000, TokensRateMicro: tok})
	other := b.replica(t, "r1", 4)
	for round, end := range []string{"return", "sweep"} {
		l, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 5000 * tok})
		if err != nil {
			t.Fatal(err)
		}
		var accepted, refused atomic.Int64
		started := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					if w == 0 && i == 20 {
						close(started)
					}
					err := b.r.journal.Append(ctx, l.ID, adm(fmt.Sprintf("%d-%d-%d", round, w, i), 3))
					if errors.Is(err, lease.ErrOver) {
						refused.Add(1)
						return
					}
					if err != nil {
						t.Error(err)
						return
					}
					accepted.Add(3 * tok)
				}
			}()
		}
		<-started // the journal is busy with this lease
		var unused int64
		if end == "return" {
			unused, err = other.leases.Return(ctx, l.ID)
		} else {
			b.advance(10 * time.Second)
			var n int
			n, err = other.leases.Sweep(ctx, 10)
			if n != 1 {
				t.Fatalf("swept %d leases, want 1", n)
			}
			unused = -1
		}
		if err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if refused.Load() != 8 {
			t.Fatalf("%s: %d appenders refused, want all 8", end, refused.Load())
		}
		if unused >= 0 && unused != 5000*tok-accepted.Load() {
			t.Fatalf("%s gave back %d, want the slice less the %d accepted", end, unused, accepted.Load())
		}
		var booked, used int64
		if err := b.r.pool.QueryRow(ctx, "SELECT booked_micro, used_micro FROM leases WHERE id = $1", l.ID).Scan(&booked, &used); err != nil {
			t.Fatal(err)
		}
		_, _, est := b.kindSumRef(t, "acme", l.ID)
		if booked != accepted.Load() || used != booked || est*tok != accepted.Load() {
			t.Fatalf("%s: accepted %d, used %d, booked %d, in the ledger %d", end, accepted.Load(), used, booked, est*tok)
		}
		if _, gave, _ := b.kindSum(t, "acme", ledger.KindLeaseReturn); round == 1 && gave <= 0 {
			t.Fatalf("no lease_return entry after the sweep")
		}
		b.verify(t, "acme")
	}
}

// kindSumRef is the count, deltas and estimates of the reserve entries a
// lease's reconciles appended (their detail names the lease).
func (b *testBundle) kindSumRef(t *testing.T, id, leaseID string) (n, delta, estimate int64) {
	t.Helper()
	err := b.r.pool.QueryRow(context.Background(),
		"SELECT count(*), coalesce(sum(delta_micro), 0), coalesce(sum(estimate), 0) FROM ledger_entries WHERE tenant_id = $1 AND kind = 'reserve' AND detail::jsonb->>'lease' = $2",
		id, leaseID).Scan(&n, &delta, &estimate)
	if err != nil {
		t.Fatal(err)
	}
	return n, delta, estimate
}

// A journal whose Run has returned refuses every append at once, so no
// caller waits for a group that never commits.
func TestJournalStopped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
	l, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 100 * tok})
	if err != nil {
		t.Fatal(err)
	}
	j := lease.NewJournal(b.r.leases)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { j.Run(runCtx); close(done) }()
	if err := j.Append(ctx, l.ID, adm("a", 10)); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	if err := j.Append(ctx, l.ID, adm("b", 10)); !errors.Is(err, lease.ErrStopped) {
		t.Fatalf("append after Run returned: %v, want ErrStopped", err)
	}
	if unused, err := b.r.leases.Return(ctx, l.ID); err != nil || unused != 90*tok {
		t.Fatalf("return: %d, %v; want the 90 not journaled", unused, err)
	}
	b.verify(t, "acme")
}

// A holder whose clock runs behind the store's never admits past its
// lease's expiry by the store's clock: the journal refuses, and the holder
// returns the lease (booking what it admitted, giving back the rest) and
// admits from a new one.
func TestHolderClockBehind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
	behind := b.clock() // the holder's clock stays here
	h := lease.NewHolder(b.r.leases, b.r.journal, lease.HolderConfig{TenantID: "acme", SliceMicro: 100 * tok, NowFunc: func() time.Time { return behind }})
	if err := h.Admit(ctx, adm("a", 10)); err != nil {
		t.Fatal(err)
	}
	first := h.LeaseID()
	b.advance(10 * time.Second) // by the store's clock the lease is past its expiry
	if err := h.Admit(ctx, adm("b", 10)); err != nil {
		t.Fatalf("admit past the expiry by the store's clock: %v", err)
	}
	if h.LeaseID() == first || h.LeaseID() == "" {
		t.Fatalf("lease %q after the expiry, want a new one", h.LeaseID())
	}
	var state string
	var used int64
	if err := b.r.pool.QueryRow(ctx, "SELECT state, used_micro FROM leases WHERE id = $1", first).Scan(&state, &used); err != nil {
		t.Fatal(err)
	}
	if state != "expired" || used != 10*tok {
		t.Fatalf("the first lease: %s with %d used; want expired with a's 10 only", state, used)
	}
	if err := h.Return(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := b.r.leases.Sweep(ctx, 10); err != nil || n != 0 {
		t.Fatalf("sweep: %d, %v; want nothing left to sweep", n, err)
	}
	// 1000 - 100 (first take) + 10 s of refill + 90 back = 1000; - 100
	// (second take) + 90 back.
	if got, want := b.balance(t, "acme"), int64(990)*tok; got != want {
		t.Fatalf("balance %d, want %d", got, want)
	}
	b.verify(t, "acme")
	if n, _, est := b.kindSum(t, "acme", ledger.KindReserve); n != 2 || est != 20 {
		t.Errorf("%d reserve entries for %d; want a and b, 20", n, est)
	}
}
