package account_test

import (
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/await"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// TestPipelineConcurrentMixExactBound: 200 callers over two replicas'
// pipelines reserve, settle and release one tenant's budget. Every balance
// recomputes from the ledger, nothing is spent twice, every reservation
// ends, and the pipelines decided many requests per transaction (entries of
// one transaction share its database time).
func TestPipelineConcurrentMixExactBound(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	b.tenant(t, "acme", limits(3000, "100"))
	pipes := []*account.Pipeline{account.NewPipeline(stores[0], nil), account.NewPipeline(stores[1], nil)}

	var admitted, rejectedN, ended, refunds atomic.Int64
	hammer(stores, func(g int, _ *account.Store) {
		for i := range 6 {
			p := pipes[(g+i)%2] // a settle often reaches the other replica
			cost := int64(10 + (g*7+i*13)%90)
			r, err := p.Reserve(ctx, reserveFor("acme", cost))
			switch {
			case errors.Is(err, rule.ErrRejected):
				rejectedN.Add(1)
				continue
			case err != nil:
				t.Error(err)
				return
			}
			admitted.Add(cost)
			other := pipes[(g+i+1)%2]
			var st *account.Settlement
			if (g+i)%3 == 0 {
				st, err = other.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: r.AdmissionID})
			} else {
				in, out := fit(r.Estimate, int64(g%30), int64((g*i)%120))
				st, err = other.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID,
					InputTokens: in, OutputTokens: out})
			}
			if err != nil {
				t.Error(err)
				return
			}
			ended.Add(1)
			if st.DeltaMicro > 0 {
				refunds.Add(st.DeltaMicro)
			}
		}
	})
	if t.Failed() {
		return
	}
	sum := sums(t, b, "acme")
	b.verify(t, "acme")
	if sum.admittedCost != admitted.Load() || sum.entries != 1+sum.admitted+ended.Load() {
		t.Fatalf("ledger: %d reserves costing %d in %d entries; callers saw %d tokens admitted and %d ended",
			sum.admitted, sum.admittedCost, sum.entries, admitted.Load(), ended.Load())
	}
	if sum.minReserveBalance < 0 {
		t.Fatalf("a reserve left the balance at %d", sum.minReserveBalance)
	}
	if bound := 3000*rule.Micro + 100*sum.elapsedMicro + refunds.Load(); sum.admittedCost*rule.Micro > bound {
		t.Fatalf("admitted %d tokens > capacity + refill x elapsed + refunds (%d micro)", sum.admittedCost, bound)
	}
	if sum.finalOpen != 0 {
		t.Fatalf("%d reservations left open", sum.finalOpen)
	}
	if rejectedN.Load() == 0 {
		t.Fatal("demand never exceeded the bucket; the test proves nothing")
	}
	var txs int64
	if err := b.pool.QueryRow(ctx, `SELECT count(DISTINCT created_at) FROM ledger_entries WHERE tenant_id = 'acme' AND kind <> 'tenant'`).Scan(&txs); err != nil {
		t.Fatal(err)
	}
	if changes := sum.entries - 1; txs*2 > changes {
		t.Fatalf("%d changes took %d transactions: the pipelines did not batch", changes, txs)
	}
	t.Logf("%d changes in %d transactions; %d rejected", sum.entries-1, txs, rejectedN.Load())
}

// TestPipelineWaitingIsBoundedAndNotAnOutage: while another session holds
// the tenant's row (a long admin transaction, another replica stalled),
// requests wait at most the pipeline's timeout for their turn and are
// answered ErrBusy, not ErrUnavailable: the store answers. None of them is
// decided, and once the row is free the pipeline decides again.
func TestPipelineWaitingIsBoundedAndNotAnOutage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(1000, "1"))
	// A timeout a CPU-starved machine's first statements (before the row
	// lock) still meet: at 300 ms, a run under two busy loops timed out
	// reading the pool routes, an answer too slow to call busy.
	const timeout = time.Second
	pipe := account.NewPipeline(b.store, &account.PipelineConfig{Timeout: timeout})

	hold, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hold.Exec(ctx, `SELECT 1 FROM tenants WHERE id = 'acme' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	errs := make([]error, 6)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { _, errs[i] = pipe.Reserve(ctx, reserveFor("acme", 10)) })
	}
	wg.Wait()
	took := time.Since(start)
	_ = hold.Rollback(ctx)
	for i, err := range errs {
		if !errors.Is(err, rule.ErrBusy) || errors.Is(err, rule.ErrUnavailable) {
			t.Fatalf("request %d: %v; want ErrBusy alone", i, err)
		}
	}
	// The timeout, plus the ping outside the pool that tells busy from down.
	if took > timeout+1500*time.Millisecond {
		t.Fatalf("waiting took %s with a %s timeout", took, timeout)
	}
	if s := b.state(t, "acme"); s.entries != 1 {
		t.Fatalf("%d ledger entries: a request that was answered busy was decided", s.entries)
	}
	if _, err := pipe.Reserve(ctx, reserveFor("acme", 10)); err != nil {
		t.Fatalf("after the row is free: %v", err)
	}
}

// TestPipelineHungStoreIsUnavailable: when Postgres stops answering (its
// host paused, the network black-holed), the request in flight and those
// queued behind it are answered ErrUnavailable within about the timeout,
// so the failure policy applies.
func TestPipelineHungStoreIsUnavailable(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	direct := account.NewStore(pgtest.Pool(t, dbURL, nil))
	if _, err := direct.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: limits(1000, "1")}); err != nil {
		t.Fatal(err)
	}
	fp := newFreezeProxy(t, dbURL)
	store := account.NewStore(pgtest.Pool(t, fp.url, func(c *pgxpool.Config) { c.ConnConfig.ConnectTimeout = time.Second }))
	t.Cleanup(fp.close) // before the pool closes: its connections then fail at once
	// The store's caches (pool routes, the tenant) are warmed by a first
	// reserve under a generous timeout: on a loaded machine their first
	// loads can take longer than the 400 ms under test, which is not what
	// this test is about.
	warm := account.NewPipeline(store, &account.PipelineConfig{Timeout: 10 * time.Second})
	if _, err := warm.Reserve(ctx, reserveFor("acme", 10)); err != nil {
		t.Fatal(err)
	}
	pipe := account.NewPipeline(store, &account.PipelineConfig{Timeout: 400 * time.Millisecond})
	fp.freeze()
	// The last answer is in the past of the requests below (the store
	// answered none of them).
	await.Until(t, time.Second, "the clock to pass the store's last answer", func() bool { return !store.AnsweredSince(time.Now()) }, nil)
	start := time.Now()
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { _, errs[i] = pipe.Reserve(ctx, reserveFor("acme", 10)) })
	}
	wg.Wait()
	took := time.Since(start)
	for i, err := range errs {
		if !errors.Is(err, rule.ErrUnavailable) || errors.Is(err, rule.ErrOutcomeUnknown) {
			t.Fatalf("request %d: %v; want ErrUnavailable", i, err)
		}
	}
	if took > 400*time.Millisecond+3*time.Second { // the timeout, then a probe connection that cannot connect
		t.Fatalf("answering took %s", took)
	}
}

// freezeProxy passes TCP between a pool and Postgres until freeze, after
// which it stops passing bytes and holds new connections open unanswered:
// what a paused host looks like from the client.
type freezeProxy struct {
	url    string
	frozen atomic.Bool
	close  func()
}

func newFreezeProxy(t *testing.T, dbURL string) *freezeProxy {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	u.Host = ln.Addr().String()
	fp := &freezeProxy{url: u.String()}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			if fp.frozen.Load() {
				continue // accepted, never answered
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, up)
			mu.Unlock()
			go fp.pipe(up, c)
			go fp.pipe(c, up)
		}
	}()
	fp.close = func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	}
	t.Cleanup(fp.close)
	return fp
}

func (fp *freezeProxy) freeze() { fp.frozen.Store(true) }

// pipe copies src to dst while the proxy is not frozen; once frozen, what
// arrives is read and dropped, as a paused peer's kernel would buffer it.
func (fp *freezeProxy) pipe(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !fp.frozen.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestPipelineGathersTheCallersItAnswered: 16 callers each wait on their
// answer before sending their next request, as an inference frontend's
// workers do. Without gathering, the next transaction starts before the
// callers it answered are back, and batches alternate between a few
// requests and the rest. With it, each transaction waits (at most its
// predecessor's duration) for them, and decides them all at once: fewer
// transactions for the same requests, every one of them exact.
func TestPipelineGathersTheCallersItAnswered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(1_000_000, "1"))
	pipe := account.NewPipeline(b.store, &account.PipelineConfig{Shards: 1, Gather: time.Second})

	const callers, rounds = 16, 10
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range callers {
		wg.Go(func() {
			<-start
			for range rounds {
				if _, err := pipe.Reserve(ctx, reserveFor("acme", 10)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	b.verify(t, "acme")
	var reserves, transactions int
	// The entries of one transaction share its database time.
	if err := b.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT created_at) FROM ledger_entries
		WHERE tenant_id = 'acme' AND kind = 'reserve'`).Scan(&reserves, &transactions); err != nil {
		t.Fatal(err)
	}
	if reserves != callers*rounds {
		t.Fatalf("%d reserves in the ledger, want %d", reserves, callers*rounds)
	}
	// The callers start a few at a time, so the first transactions are
	// partial; from the first busy one on, each gathers all of them.
	if transactions > rounds+4 {
		t.Fatalf("%d requests took %d transactions: the pipeline did not gather the callers it answered (at most %d expected)",
			reserves, transactions, rounds+4)
	}
}

// TestPipelineGatherWaitsNoLongerThanATransaction: once the callers stop
// coming back, the request that does come is decided within about one
// transaction's duration, not after the configured Gather.
func TestPipelineGatherWaitsNoLongerThanATransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(1_000_000, "1"))
	pipe := account.NewPipeline(b.store, &account.PipelineConfig{Shards: 1, Gather: 30 * time.Second})

	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 2 * account.GatherFrom {
		wg.Go(func() {
			<-start
			if _, err := pipe.Reserve(ctx, reserveFor("acme", 10)); err != nil {
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	// The busy batch's callers do not come back: one request alone.
	began := time.Now()
	if _, err := pipe.Reserve(ctx, reserveFor("acme", 10)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("a lone request after a busy batch took %s: it waited for callers that never came", took)
	}
	if s := b.state(t, "acme"); s.entries != 2+2*account.GatherFrom {
		t.Fatalf("%d ledger entries, want %d", s.entries, 2+2*account.GatherFrom)
	}
}
