package account_test

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// replicas returns two Stores on separate pools over one database, as two
// tokengate replicas would be, with 12 connections each.
func replicas(t *testing.T) (*testBundle, []*account.Store) {
	t.Helper()
	url := pgtest.URL(t)
	cfg := func(c *pgxpool.Config) { c.MaxConns = 12; c.MinConns = 12 }
	p1, p2 := pgtest.Pool(t, url, cfg), pgtest.Pool(t, url, cfg)
	return &testBundle{pool: p1, store: account.NewStore(p1)}, []*account.Store{account.NewStore(p1), account.NewStore(p2)}
}

// hammer runs fn from 200 goroutines, spread over the stores.
func hammer(stores []*account.Store, fn func(g int, s *account.Store)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range 200 {
		wg.Go(func() {
			<-start
			fn(g, stores[g%len(stores)])
		})
	}
	close(start)
	wg.Wait()
}

type ledgerSums struct {
	admitted, admittedCost, refill int64
	minReserveBalance              int64
	maxOpen, finalOpen             int64
	entries                        int64
	elapsedMicro                   int64 // first to last entry, database times
}

func sums(t *testing.T, b *testBundle, id string) ledgerSums {
	t.Helper()
	rows, err := b.pool.Query(ctx, `SELECT kind, coalesce(estimate, 0), refill_micro, balance_micro, created_at FROM ledger_entries WHERE tenant_id = $1 ORDER BY seq`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	s := ledgerSums{minReserveBalance: 1 << 62}
	var open int64
	var first, last int64
	for rows.Next() {
		var kind string
		var est, refill, balance int64
		var at time.Time
		if err := rows.Scan(&kind, &est, &refill, &balance, &at); err != nil {
			t.Fatal(err)
		}
		if s.entries == 0 {
			first = at.UnixMicro()
		}
		last = at.UnixMicro()
		s.entries++
		s.refill += refill
		switch kind {
		case "reserve":
			s.admitted++
			s.admittedCost += est
			s.minReserveBalance = min(s.minReserveBalance, balance)
			open++
			s.maxOpen = max(s.maxOpen, open)
		case "settle", "release", "expire":
			open--
		}
	}
	s.finalOpen = open
	s.elapsedMicro = last - first
	return s
}

func TestConcurrentTokensExactBound(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	const capacity = 3000
	b.tenant(t, "acme", limits(capacity, "50"))

	var admitted, rejectedN atomic.Int64
	hammer(stores, func(g int, s *account.Store) {
		for i := range 8 {
			cost := int64(1 + (g*7+i*13)%40)
			p := reserve(cost)
			p.TenantID = "acme"
			_, err := s.Reserve(ctx, p)
			switch {
			case err == nil:
				admitted.Add(cost)
			case errors.Is(err, rule.ErrRejected):
				rejectedN.Add(1)
			default:
				t.Error(err)
				return
			}
		}
	})
	sum := sums(t, b, "acme")
	tally := b.verify(t, "acme")
	if sum.admittedCost != admitted.Load() || sum.entries != sum.admitted+1 {
		t.Fatalf("ledger holds %d admissions costing %d; callers saw %d admitted", sum.admitted, sum.admittedCost, admitted.Load())
	}
	// With no settles the bound is exact: everything admitted came from the
	// starting capacity plus refill, and the refill is at most rate x elapsed
	// between database times.
	if got, want := sum.admittedCost*rule.Micro, capacity*rule.Micro+sum.refill-tally.BalanceMicro; got != want {
		t.Fatalf("admitted %d micro-tokens, but capacity + refill - balance = %d", got, want)
	}
	maxRefill := 50 * sum.elapsedMicro
	if sum.refill > maxRefill {
		t.Fatalf("refill %d exceeds rate x elapsed %d", sum.refill, maxRefill)
	}
	if sum.admittedCost*rule.Micro > capacity*rule.Micro+maxRefill {
		t.Fatalf("admitted %d tokens > capacity + rate x elapsed", sum.admittedCost)
	}
	if sum.minReserveBalance < 0 {
		t.Fatalf("a reserve left the balance at %d", sum.minReserveBalance)
	}
	if rejectedN.Load() == 0 {
		t.Fatal("demand never exceeded the bucket; the test proves nothing")
	}
	t.Logf("admitted %d tokens in %d requests, %d rejected, refill %.3f tokens over %.3f s",
		sum.admittedCost, sum.admitted, rejectedN.Load(), float64(sum.refill)/rule.Micro, float64(sum.elapsedMicro)/1e6)
}

func TestConcurrentRequestBucketExact(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	l := limits(1_000_000, "1000")
	l.RequestsCapacity, l.RequestsRateMicro = 37, 1 // one request per 1e6 s: no refill during the test
	b.tenant(t, "acme", l)
	var admitted atomic.Int64
	hammer(stores, func(g int, s *account.Store) {
		p := reserve(1)
		p.TenantID = "acme"
		_, err := s.Reserve(ctx, p)
		if err == nil {
			admitted.Add(1)
		} else if !errors.Is(err, rule.ErrRejected) {
			t.Error(err)
		}
	})
	if admitted.Load() != 37 || sums(t, b, "acme").admitted != 37 {
		t.Fatalf("admitted %d, want exactly the 37 requests of the bucket", admitted.Load())
	}
	b.verify(t, "acme")
}

func TestConcurrentConcurrencyLimit(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	l := limits(1_000_000, "1000")
	l.MaxConcurrent = 7
	b.tenant(t, "acme", l)
	var admitted atomic.Int64
	hammer(stores, func(g int, s *account.Store) {
		for range 3 {
			p := reserve(5)
			p.TenantID = "acme"
			r, err := s.Reserve(ctx, p)
			if errors.Is(err, rule.ErrRejected) {
				continue
			}
			if err != nil {
				t.Error(err)
				return
			}
			admitted.Add(1)
			if g%2 == 0 {
				_, err = s.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 1, OutputTokens: 1})
			} else {
				_, err = s.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: r.AdmissionID})
			}
			if err != nil {
				t.Error(err)
				return
			}
		}
	})
	sum := sums(t, b, "acme")
	if sum.maxOpen > 7 || sum.maxOpen < 2 {
		t.Fatalf("open reservations peaked at %d, limit 7", sum.maxOpen)
	}
	snap, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil || sum.finalOpen != 0 || snap.OpenReservations != 0 {
		t.Fatalf("after every reservation ended: ledger open %d, row open %d (%v)", sum.finalOpen, snap.OpenReservations, err)
	}
	if sum.admitted != admitted.Load() {
		t.Fatalf("ledger %d admissions, callers %d", sum.admitted, admitted.Load())
	}
	b.verify(t, "acme")

	// Without settles exactly the limit is admitted.
	b.tenant(t, "hold", l)
	var held atomic.Int64
	hammer(stores, func(g int, s *account.Store) {
		p := reserve(5)
		p.TenantID = "hold"
		if _, err := s.Reserve(ctx, p); err == nil {
			held.Add(1)
		}
	})
	if held.Load() != 7 {
		t.Fatalf("held %d open reservations, want exactly 7", held.Load())
	}
}

func TestConcurrentPeriodBudget(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	l := limits(1_000_000, "1000")
	l.PeriodBudget, l.Period = 1000, rule.PeriodMonth
	b.tenant(t, "acme", l)
	var admitted atomic.Int64
	hammer(stores, func(g int, s *account.Store) {
		for i := range 4 {
			cost := int64(1 + (g+i)%9)
			p := reserve(cost)
			p.TenantID = "acme"
			if _, err := s.Reserve(ctx, p); err == nil {
				admitted.Add(cost)
			} else if !errors.Is(err, rule.ErrRejected) {
				t.Error(err)
			}
		}
	})
	tally := b.verify(t, "acme")
	// Never above the budget; and since demand (about 4000) far exceeded
	// it, at most one largest request (9) short of it.
	if got := admitted.Load(); got > 1000 || got < 1000-8 || tally.PeriodUsed != got {
		t.Fatalf("admitted %d against a period budget of 1000 (ledger period_used %d)", got, tally.PeriodUsed)
	}
}

func TestConcurrentSettlesKeepLedgerExact(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	b.tenant(t, "acme", limits(2000, "100"))
	var refunds atomic.Int64
	hammer(stores, func(g int, s *account.Store) {
		for i := range 5 {
			cost := int64(5 + (g*3+i)%30)
			p := reserve(cost)
			p.TenantID = "acme"
			r, err := s.Reserve(ctx, p)
			if errors.Is(err, rule.ErrRejected) {
				continue
			}
			if err != nil {
				t.Error(err)
				return
			}
			// Actual usage: sometimes less, sometimes more than the estimate.
			in, out := fit(r.Estimate, int64((g+i)%20), int64((g*i)%25))
			st, err := s.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: in, OutputTokens: out})
			if err != nil {
				t.Error(err)
				return
			}
			if st.DeltaMicro > 0 {
				refunds.Add(st.DeltaMicro)
			}
		}
	})
	sum := sums(t, b, "acme")
	b.verify(t, "acme")
	if sum.minReserveBalance < 0 {
		t.Fatalf("a reserve left the balance at %d", sum.minReserveBalance)
	}
	bound := 2000*rule.Micro + 100*sum.elapsedMicro + refunds.Load()
	if sum.admittedCost*rule.Micro > bound {
		t.Fatalf("admitted %d tokens > capacity + refill x elapsed + refunds (%d micro)", sum.admittedCost, bound)
	}
	if sum.finalOpen != 0 {
		t.Fatalf("%d reservations left open", sum.finalOpen)
	}
}

// TestConcurrentSweepersExpireEachOnce: four replicas sweep at once while
// callers settle some of the same reservations. Every reservation ends
// exactly once, and the slots all come back.
func TestConcurrentSweepersExpireEachOnce(t *testing.T) {
	t.Parallel()
	for _, through := range []string{"own transactions", "pipelines"} {
		t.Run(through, func(t *testing.T) {
			t.Parallel()
			sweepersExpireEachOnce(t, through == "pipelines")
		})
	}
}

// sweepersExpireEachOnce: four sweepers (in their own transactions, or
// decided through each replica's pipeline with its other requests) and 60
// settles race over 240 overdue reservations.
func sweepersExpireEachOnce(t *testing.T, pipelined bool) {
	b, stores := replicas(t)
	pipes := []*account.Pipeline{account.NewPipeline(stores[0], nil), account.NewPipeline(stores[1], nil)}
	l := limits(1_000_000, "1000")
	l.MaxConcurrent = 300
	b.tenant(t, "acme", l)
	b.tenant(t, "globex", l)
	var ids []string
	for i := range 240 {
		tenant := []string{"acme", "globex"}[i%2]
		r := b.mustReserve(t, tenant, 3)
		ids = append(ids, tenant+"/"+r.AdmissionID)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE admissions SET expires_at = clock_timestamp() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	var expired, settled atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			var expire account.ExpireFunc
			if pipelined {
				expire = pipes[w%2].Expire
			}
			n, err := stores[w%2].SweepOnce(ctx, expire)
			if err != nil {
				t.Error(err)
			}
			expired.Add(int64(n))
		})
	}
	for i, id := range ids[:60] {
		wg.Go(func() {
			tenant, adm, _ := strings.Cut(id, "/")
			p := account.SettleParams{TenantID: tenant, AdmissionID: adm, InputTokens: 1, OutputTokens: 1}
			var err error
			if pipelined {
				_, err = pipes[i%2].Settle(ctx, p)
			} else {
				_, err = stores[i%2].Settle(ctx, p)
			}
			if err != nil {
				t.Error(err)
				return
			}
			settled.Add(1)
		})
	}
	wg.Wait()
	// A few reservations may have been settled before any sweeper reached
	// them; the rest expired, each once.
	var expireEntries, settleEntries int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 'expire'), count(*) FILTER (WHERE kind = 'settle')
		FROM ledger_entries`).Scan(&expireEntries, &settleEntries); err != nil {
		t.Fatal(err)
	}
	if expireEntries != expired.Load() || settleEntries != 60 {
		t.Fatalf("%d expire entries (sweepers reported %d), %d settle entries (want 60)", expireEntries, expired.Load(), settleEntries)
	}
	var reserved, open int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'reserved') FROM admissions`).Scan(&reserved); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(ctx, `SELECT sum(open_reservations) FROM tenants`).Scan(&open); err != nil {
		t.Fatal(err)
	}
	if reserved != 0 || open != 0 || settled.Load() != 60 {
		t.Fatalf("after the sweep: %d still reserved, %d slots open, %d settled", reserved, open, settled.Load())
	}
	// Each admission ended exactly once: expired, settled, or expired then
	// settled late.
	var dupes int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT admission_id FROM ledger_entries WHERE kind = 'expire'
		GROUP BY admission_id HAVING count(*) > 1) d`).Scan(&dupes); err != nil || dupes != 0 {
		t.Fatalf("%d admissions expired twice (%v)", dupes, err)
	}
	if expireEntries < 180 || expireEntries > 240 {
		t.Fatalf("%d expired, want 180 to 240", expireEntries)
	}
	b.verify(t, "acme")
	b.verify(t, "globex")
}
