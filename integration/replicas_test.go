package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/api"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

// TestMain builds the tokenizer tables before any test times a request:
// building them costs a second, and several under -race on a busy machine,
// which a first request's client timeout would turn into retries.
func TestMain(m *testing.M) {
	if err := estimator.Load(); err != nil {
		panic(err)
	}
	pgtest.Main(m)
}

var ctx = context.Background()

type cluster struct {
	pool  *pgxpool.Pool
	urls  []string
	store *account.Store
}

// startReplicas starts n tokengate servers, each with its own pool of
// conns connections, on one database.
func startReplicas(t *testing.T, n int, conns int32) *cluster {
	t.Helper()
	dbURL := pgtest.URL(t)
	c := &cluster{}
	for range n {
		c.urls = append(c.urls, startReplica(t, pgtest.Pool(t, dbURL, func(cfg *pgxpool.Config) { cfg.MaxConns = conns })))
	}
	c.pool = pgtest.Pool(t, dbURL, nil)
	c.store = account.NewStore(c.pool)
	return c
}

// startReplica starts one server on pool and returns its base URL.
func startReplica(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	rep, err := replica.New(replica.Config{DB: pool, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rep.Close)
	srv, err := api.New(rep, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(sctx, ln) }()
	t.Cleanup(func() { cancel(); <-done; _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

func (c *cluster) tenant(t *testing.T, id string, capacity int64, perSecond string) string {
	t.Helper()
	rate, err := rule.ParseRate(perSecond)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: rule.Limits{TokensCapacity: capacity, TokensRateMicro: rate}}); err != nil {
		t.Fatal(err)
	}
	_, key, err := credential.KeyCreate(ctx, c.pool, id)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 200, MaxConnsPerHost: 200}, Timeout: 30 * time.Second}

func post(t *testing.T, url, key, body string) (int, []byte) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewBufferString(body))
	if err != nil {
		t.Error(err)
		return 0, nil
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		t.Error(err)
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

type ledgerFacts struct {
	reserves, settles, releases, entries int64
	reservedCost, refill, refunds        int64
	minReserveBalance                    int64
	firstAt, lastAt                      time.Time
}

func facts(t *testing.T, pool *pgxpool.Pool, tenant string) ledgerFacts {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT kind, coalesce(estimate, 0), refill_micro, delta_micro, balance_micro, created_at
		FROM ledger_entries WHERE tenant_id = $1 ORDER BY seq`, tenant)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	f := ledgerFacts{minReserveBalance: 1 << 62}
	for rows.Next() {
		var kind string
		var est, refill, delta, balance int64
		var at time.Time
		if err := rows.Scan(&kind, &est, &refill, &delta, &balance, &at); err != nil {
			t.Fatal(err)
		}
		if f.entries == 0 {
			f.firstAt = at
		}
		f.lastAt = at
		f.entries++
		f.refill += refill
		switch kind {
		case "reserve":
			f.reserves++
			f.reservedCost += est
			f.minReserveBalance = min(f.minReserveBalance, balance)
		case "settle":
			f.settles++
		case "release":
			f.releases++
		}
		if (kind == "settle" || kind == "release") && delta > 0 {
			f.refunds += delta
		}
	}
	return f
}

func verify(t *testing.T, pool *pgxpool.Pool, tenant string) ledger.Tally {
	t.Helper()
	tally, err := ledger.Verify(ctx, pool, tenant)
	if err != nil {
		t.Fatal(err)
	}
	var stored int64
	if err := pool.QueryRow(ctx, `SELECT tokens_micro FROM tenants WHERE id = $1`, tenant).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != tally.BalanceMicro {
		t.Fatalf("ledger recomputes %d, the tenant row holds %d", tally.BalanceMicro, stored)
	}
	return tally
}

// TestReplicasShareOneAllowance: 200 goroutines over two server instances
// (24 database connections in all) hit one tenant with mixed costs, settles
// and releases. No balance is spent twice, and the ledger accounts for every
// change exactly.
func TestReplicasShareOneAllowance(t *testing.T) {
	t.Parallel()
	shareOneAllowance(t)
}

// TestReplicasShareOneAllowanceUnderCPUContention is the same load while
// goroutines spin on every core, as when other test packages, a compiler or
// a noisy neighbour share the machine: Postgres stays healthy, only slower
// to be scheduled, so no request may be told the store is unavailable, and
// this ordinary load must be served without any 503. Not parallel: the
// spinners slow the whole process, so it runs alone in its package.
func TestReplicasShareOneAllowanceUnderCPUContention(t *testing.T) {
	spinCPU(t, 4*runtime.GOMAXPROCS(0))
	shareOneAllowance(t)
}

// spinCPU keeps n goroutines busy until the test ends. They never yield, so
// every other goroutine (the one holding a tenant's row lock among them)
// waits for preemption to be scheduled.
func spinCPU(t *testing.T, n int) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			x := uint64(1)
			for !stop.Load() {
				for range 1 << 16 {
					x = x*6364136223846793005 + 1442695040888963407
				}
			}
			_ = x
		})
	}
	t.Cleanup(func() { stop.Store(true); wg.Wait() })
}

// shareOneAllowance drives 200 callers over two replicas and checks every
// answer and the ledger.
func shareOneAllowance(t *testing.T) {
	c := startReplicas(t, 2, 12)
	const capacity, rate = 20_000, 500
	key := c.tenant(t, "acme", capacity, fmt.Sprint(rate))

	var admitted, rejected, settled, released atomic.Int64
	var slowest atomic.Int64 // nanoseconds: the longest answer any caller waited for
	timed := func(url, key, body string) (int, []byte) {
		t0 := time.Now()
		code, resp := post(t, url, key, body)
		d := int64(time.Since(t0))
		for cur := slowest.Load(); d > cur && !slowest.CompareAndSwap(cur, d); cur = slowest.Load() {
		}
		return code, resp
	}
	var failMu sync.Mutex
	failures := map[string]int{} // "admission 503 store_busy" -> count
	fail := func(what string, code int, body []byte) {
		var e struct{ Error struct{ Type string } }
		_ = json.Unmarshal(body, &e)
		failMu.Lock()
		failures[fmt.Sprintf("%s %d %s", what, code, e.Error.Type)]++
		failMu.Unlock()
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	began := time.Now()
	for g := range 200 {
		wg.Go(func() {
			<-start
			url := c.urls[g%len(c.urls)]
			for i := range 6 {
				maxTokens := 20 + (g*37+i*101)%480
				body := fmt.Sprintf(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"request %d of worker %d"}],"max_tokens":%d}`, i, g, maxTokens)
				code, resp := timed(url+"/v1/admissions", key, body)
				switch code {
				case http.StatusCreated:
					admitted.Add(1)
				case http.StatusTooManyRequests:
					rejected.Add(1)
					continue
				default:
					fail("admission", code, resp)
					continue
				}
				var a struct{ ID string }
				_ = json.Unmarshal(resp, &a)
				// Settle on the other replica half of the time.
				other := c.urls[(g+i)%len(c.urls)]
				what, counter := "settle", &settled
				switch (g + i) % 3 {
				case 0: // used less than estimated
					code, resp = timed(other+"/v1/admissions/"+a.ID+"/settle", key, fmt.Sprintf(`{"usage":{"prompt_tokens":12,"completion_tokens":%d}}`, maxTokens/3))
				case 1: // used more: an extra charge (in the input: the output is bounded by what was reserved)
					code, resp = timed(other+"/v1/admissions/"+a.ID+"/settle", key, fmt.Sprintf(`{"usage":{"prompt_tokens":70,"completion_tokens":%d}}`, maxTokens))
				case 2:
					what, counter = "release", &released
					code, resp = timed(other+"/v1/admissions/"+a.ID+"/release", key, "")
				}
				if code != http.StatusOK {
					fail(what, code, resp)
					continue
				}
				counter.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	took := time.Since(began)
	if len(failures) > 0 {
		t.Fatalf("after %s, answers other than 201, 429 and 200: %v (%d admitted, %d rejected)", took, failures, admitted.Load(), rejected.Load())
	}
	if t.Failed() {
		return
	}

	f := facts(t, c.pool, "acme")
	verify(t, c.pool, "acme")
	if f.reserves != admitted.Load() || f.settles != settled.Load() || f.releases != released.Load() ||
		f.entries != 1+f.reserves+f.settles+f.releases {
		t.Fatalf("ledger: %d reserves, %d settles, %d releases in %d entries; callers saw %d admitted, %d settled, %d released",
			f.reserves, f.settles, f.releases, f.entries, admitted.Load(), settled.Load(), released.Load())
	}
	if f.minReserveBalance < 0 {
		t.Fatalf("a reserve drove the balance to %d", f.minReserveBalance)
	}
	elapsed := f.lastAt.Sub(f.firstAt).Microseconds()
	bound := capacity*rule.Micro + rate*elapsed + f.refunds
	if f.reservedCost*rule.Micro > bound {
		t.Fatalf("admitted %d tokens > capacity + refill x elapsed + refunds = %.3f", f.reservedCost, float64(bound)/rule.Micro)
	}
	if rejected.Load() == 0 {
		t.Fatal("demand never exceeded the allowance; the test proves nothing")
	}
	t.Logf("%d admitted (%d tokens), %d rejected, %d settled, %d released; load took %s, slowest answer %s",
		admitted.Load(), f.reservedCost, rejected.Load(), settled.Load(), released.Load(), took.Round(time.Millisecond),
		time.Duration(slowest.Load()).Round(time.Millisecond))
}

// TestReplicasExactBoundWithoutSettles: with no settles, what two replicas
// admit is exactly the starting capacity plus the refill the ledger
// recorded, and that refill is at most rate x elapsed database time.
func TestReplicasExactBoundWithoutSettles(t *testing.T) {
	t.Parallel()
	c := startReplicas(t, 2, 12)
	const capacity, rate = 15_000, 300
	key := c.tenant(t, "acme", capacity, fmt.Sprint(rate))
	var admittedCost, rejected atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range 200 {
		wg.Go(func() {
			<-start
			for i := range 4 {
				maxTokens := 10 + (g*53+i*29)%300
				body := fmt.Sprintf(`{"model":"gpt-4o","prompt":"x","max_tokens":%d}`, maxTokens)
				code, resp := post(t, c.urls[(g+i)%2]+"/v1/admissions", key, body)
				var a struct {
					Estimate struct{ Cost int64 } `json:"estimate"`
				}
				_ = json.Unmarshal(resp, &a)
				switch code {
				case http.StatusCreated:
					admittedCost.Add(a.Estimate.Cost)
				case http.StatusTooManyRequests:
					rejected.Add(1)
				default:
					t.Errorf("%d %s", code, resp)
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	f := facts(t, c.pool, "acme")
	tally := verify(t, c.pool, "acme")
	if f.reservedCost != admittedCost.Load() {
		t.Fatalf("ledger reserved %d, callers saw %d", f.reservedCost, admittedCost.Load())
	}
	if got, want := f.reservedCost*rule.Micro, capacity*rule.Micro+f.refill-tally.BalanceMicro; got != want {
		t.Fatalf("admitted %d micro-tokens != capacity + refill - balance = %d", got, want)
	}
	if maxRefill := rate * f.lastAt.Sub(f.firstAt).Microseconds(); f.refill > maxRefill {
		t.Fatalf("refill %d > rate x elapsed %d", f.refill, maxRefill)
	}
	if f.minReserveBalance < 0 || rejected.Load() == 0 {
		t.Fatalf("min balance %d, %d rejected", f.minReserveBalance, rejected.Load())
	}
}
