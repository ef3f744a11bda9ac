//go:build cluster && soak

package cluster_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/await"
)

// TestSoak runs a randomized workload against three replicas (containers)
// on one Postgres while faults strike at random moments, records every
// request and answer the clients saw, and then checks the whole history
// and the ledger against a single-threaded model of the admission contract (docs/contract.md; model_test.go)
// that shares no code with budget. Clients come through all three faces of
// every replica: the HTTP API, the proxy (its OpenAI wire and its Gemini
// wire, in front of an upstream this process emulates) and Envoy's rate
// limit service. Part of the tenants, chosen by the seed, are in lease mode
// auto (leaseModes) on a 2 s lease TTL, so quota leasing runs beside exact
// mode under every fault, a replica killed and one cut off past the TTL
// with admissions in flight among them; the checker holds the leases to
// the bounds of docs/leasing.md (model_lease_test.go). SOAK_SECONDS
// (default 60) and SOAK_SEED (default: from the clock, printed) choose the
// run; `make soak` runs it.
func TestSoak(t *testing.T) { soak(t, false) }

// TestSoakHA is the soak on a highly available store: three Postgres
// nodes under Patroni in synchronous mode (integration/patroni) instead of
// one Postgres, and the faults that only one Postgres has replaced by a
// cluster's: the primary killed (a failover to the synchronous standby,
// the old primary started again later to rejoin as a replica), the
// primary restarted, a planned switchover, a node paused. The model is the
// same: synchronous mode loses no commit it acknowledged, so a failover
// may only lose what a client was never told of; the lease tenants are
// the same, and so are the lease checks, with no tolerance for a failover
// (model_lease_test.go). `make soak-ha` runs it.
func TestSoakHA(t *testing.T) { soak(t, true) }

func soak(t *testing.T, ha bool) {
	seconds := envInt("SOAK_SECONDS", 60)
	seed := int64(envInt("SOAK_SEED", int(time.Now().UnixNano()%1_000_000_000)))
	target := "soak"
	if ha {
		target = "soak-ha"
	}
	t.Logf("soak: %d s, seed %d (reproduce with make %s SOAK_SEED=%d SOAK_SECONDS=%d)", seconds, seed, target, seed, seconds)

	// Every replica reaches Postgres through its own TCP proxy (cut and
	// slowed at random), and one replica's clock is off by a skew the seed
	// chooses (it matters to the local failure policy, which "loc" uses,
	// and to the lease holders, which must not compare it with the
	// store's).
	proxies := newPGProxies(t)
	sr := rand.New(rand.NewPCG(uint64(seed), 3000))
	skewed := fmt.Sprintf("replica-%d", 1+sr.IntN(3))
	skew := time.Duration(30+sr.IntN(570)) * time.Second
	if sr.IntN(2) == 0 {
		skew = -skew
	}
	t.Logf("soak: %s's clock is off by %s", skewed, skew)
	// One replica's lease journal writes the compact journal's groups
	// shape, the others rows (serve --lease-journal): the checker reads
	// both, and a settle reaching a replica of the other shape crosses
	// them. A stream of its own, so that the seed's other choices stay.
	grouped := fmt.Sprintf("replica-%d", 1+rand.New(rand.NewPCG(uint64(seed), 3001)).IntN(3))
	t.Logf("soak: %s's lease journal writes groups", grouped)
	var up *provider // the OpenAI and Gemini upstream the proxies call
	c := startClusterOn(t, ha, 3, map[string]string{"TOKENGATE_STORE_TIMEOUT": "2s", "TOKENGATE_SWEEP_INTERVAL": "500ms", "TOKENGATE_REPLICAS": "3",
		"TOKENGATE_RLS_ADDR": ":8081", "TOKENGATE_PROXY_ADDR": ":8082", "TOKENGATE_LEASE_TTL": leaseTTL.String(),
		// The invariant watch every second, through the load and its faults:
		// what it reads outside any snapshot must never look like a finding.
		"TOKENGATE_WATCH_INTERVAL": "1s"},
		func(c *cluster, name string) map[string]string {
			if up == nil {
				up = newProvider(t, c)
			}
			env := proxies.env(c, name)
			env["TOKENGATE_UPSTREAM"] = "http://" + up.addr
			env["TOKENGATE_GEMINI_UPSTREAM"], env["TOKENGATE_GEMINI_UPSTREAM_KEY"] = "http://"+up.addr, soakGeminiKey
			if name == skewed {
				env["TOKENGATE_CLOCK_OFFSET"] = skew.String()
			}
			if name == grouped {
				env["TOKENGATE_LEASE_JOURNAL"] = "groups"
			}
			return env
		})
	if ha && os.Getenv("SOAK_HA_PLANT") == "async" {
		// A planted weakness, to see that the checker catches what it
		// costs: a commit is acknowledged before the synchronous standby
		// has it, so a killed primary takes the last ones with it (and
		// each kill pauses that standby before, and writes 30 MB of WAL
		// it will not get: failover), and a standby that far behind may
		// still be promoted.
		if err := c.ha.Configure(ctx, map[string]any{"maximum_lag_on_failover": 1 << 30,
			"postgresql": map[string]any{"parameters": map[string]any{"synchronous_commit": "local"}}}); err != nil {
			t.Fatal(err)
		}
		t.Logf("soak: planted: synchronous_commit=local (a commit does not wait for the standby), maximum_lag_on_failover 1 GiB")
	}
	const ttl = 3 * time.Second
	tenants := map[string]rule.Limits{
		"tok":  {TokensCapacity: 3000, TokensRateMicro: 300 * rule.Micro, ReservationTTL: ttl},
		"req":  {TokensCapacity: 1_000_000, TokensRateMicro: 10_000 * rule.Micro, RequestsCapacity: 30, RequestsRateMicro: 4 * rule.Micro, ReservationTTL: ttl},
		"conc": {TokensCapacity: 1_000_000, TokensRateMicro: 10_000 * rule.Micro, MaxConcurrent: 4, ReservationTTL: ttl},
		"per":  {TokensCapacity: 1_000_000, TokensRateMicro: 10_000 * rule.Micro, PeriodBudget: 15_000, Period: rule.PeriodDay, ReservationTTL: ttl},
		// Admitted by the replicas on their own while Postgres is away,
		// and replayed into it afterwards.
		"loc": {TokensCapacity: 3000, TokensRateMicro: 300 * rule.Micro, MaxConcurrent: 6, ReservationTTL: ttl, OnStoreUnavailable: rule.PolicyLocal},
		// A budget nested in another: "ta" and "tb" must each fit "org".
		"org": {TokensCapacity: 4000, TokensRateMicro: 400 * rule.Micro, MaxConcurrent: 6, ReservationTTL: ttl},
		"ta":  {TokensCapacity: 3000, TokensRateMicro: 250 * rule.Micro, ReservationTTL: ttl},
		"tb":  {TokensCapacity: 1_000_000, TokensRateMicro: 10_000 * rule.Micro, RequestsCapacity: 20, RequestsRateMicro: 3 * rule.Micro, ReservationTTL: ttl},
		// Token buckets only, so that lease mode auto leases them
		// (leaseModes): one alone, and two nested in "lorg".
		"lz":   {TokensCapacity: 3000, TokensRateMicro: 300 * rule.Micro, ReservationTTL: ttl},
		"lorg": {TokensCapacity: 5000, TokensRateMicro: 500 * rule.Micro, ReservationTTL: ttl},
		"la":   {TokensCapacity: 3000, TokensRateMicro: 250 * rule.Micro, ReservationTTL: ttl},
		"lb":   {TokensCapacity: 3000, TokensRateMicro: 250 * rule.Micro, ReservationTTL: ttl},
	}
	parents := map[string]string{"ta": "org", "tb": "org", "la": "lorg", "lb": "lorg"}
	keys := map[string]string{}
	var names []string // the tenants clients use
	for _, id := range []string{"tok", "req", "conc", "per", "loc", "org", "ta", "tb", "lz", "lorg", "la", "lb"} {
		if _, err := c.store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: tenants[id], Parent: parents[id]}); err != nil {
			t.Fatal(err)
		}
		if id == "org" || id == "lorg" {
			continue
		}
		_, key, err := credential.KeyCreate(ctx, c.pool, id)
		if err != nil {
			t.Fatal(err)
		}
		keys[id] = key
		names = append(names, id)
	}
	_, adminToken, err := credential.AdminTokenCreate(ctx, c.pool, "soak")
	if err != nil {
		t.Fatal(err)
	}
	_, gateway, err := credential.GatewayCreate(ctx, c.pool, "soak-envoy", names)
	if err != nil {
		t.Fatal(err)
	}
	rlsc := &rlsClients{credential: gateway, conns: map[string]*grpc.ClientConn{}}
	t.Cleanup(rlsc.close)
	leaseModes(t, c, adminToken, seed)

	h := &history{start: time.Now()}
	for _, rep := range c.replicas {
		h.replicas = append(h.replicas, rep.name)
	}
	w := &workload{c: c, h: h, keys: keys, names: names, admin: adminToken, proxies: proxies, provider: up, rls: rlsc,
		promptTokens: measurePrompts(t, c.replicas[0].url, keys[names[0]]), gemini: measureGemini(t, c.replicas[0].proxyURL, keys[names[0]]), plantAsync: ha && os.Getenv("SOAK_HA_PLANT") == "async"}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// Client i is the same frontend whatever the seed: 0-11 call the API,
	// 12-17 the proxy's OpenAI wire, 18-23 the rate limit service, 24-27
	// the proxy's Gemini wire.
	for i := range 28 {
		r := rand.New(rand.NewPCG(uint64(seed), uint64(i)))
		switch {
		case i < 12:
			wg.Go(func() { w.client(r, i, stop) })
		case i < 18:
			wg.Go(func() { w.proxyClient(r, i, stop) })
		case i >= 24:
			wg.Go(func() { w.geminiClient(r, i, stop) })
		default:
			wg.Go(func() { w.rlsClient(r, i, stop) })
		}
	}
	wg.Go(func() { w.operator(rand.New(rand.NewPCG(uint64(seed), 1000)), stop) })
	faults := map[string]int{}
	if ha {
		wg.Go(func() { w.haFaults(t, rand.New(rand.NewPCG(uint64(seed), 2000)), stop, faults) })
	} else {
		wg.Go(func() { w.faults(t, rand.New(rand.NewPCG(uint64(seed), 2000)), stop, faults) })
	}
	time.Sleep(time.Duration(seconds) * time.Second) // real time: the soak's length (SOAK_SECONDS) is a duration
	close(stop)
	wg.Wait()

	// Every replica up, every spool of local decisions replayed, and then
	// every reservation past its TTL and the sweep.
	c.reconnect(t)
	replicasUp(t, c)
	// (One that never comes is a commit lost: the checker reports it.)
	var m []string
	if !await.For(90*time.Second, 100*time.Millisecond, func() bool { m = missing(c.pool, h); return len(m) == 0 }) {
		t.Errorf("soak: after 90 s, %d admissions clients were told of are not in the ledger (a spool not replayed, or a commit lost): %v",
			len(m), m[:min(5, len(m))])
	}
	var reserved int
	if !await.For(ttl+60*time.Second, 200*time.Millisecond, func() bool {
		err := c.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM admissions WHERE state = 'reserved')
			+ (SELECT count(*) FROM lease_group_admissions WHERE state = 'reserved')`).Scan(&reserved)
		return err == nil && reserved == 0
	}) {
		t.Errorf("soak: %d reservations still open %s after the load, past their TTL (%s) and the sweep", reserved, ttl+60*time.Second, ttl)
	}
	// Every lease ended: a replica gives back a tenant's lease once it
	// admitted nothing of it for a TTL, and the sweepers expire the rest.
	var live int
	if !await.For(leaseTTL+30*time.Second, 200*time.Millisecond, func() bool {
		err := c.pool.QueryRow(ctx, `SELECT count(*) FROM leases WHERE state = 'live'`).Scan(&live)
		return err == nil && live == 0
	}) {
		t.Errorf("soak: %d leases still live %s after the load", live, leaseTTL+30*time.Second)
	}
	ops, local := map[string]int{}, map[string]int{}
	for _, e := range h.events {
		ops[fmt.Sprintf("%s %s %d", e.face, e.op, e.code)]++
		if e.local && e.code == http.StatusCreated {
			local[e.replica]++
		}
	}
	t.Logf("soak: admitted locally (the local failure policy), by replica: %v", local)
	t.Logf("soak: %d requests; answers %v; faults %v", len(h.events), ops, faults)
	if ha {
		h.logFailovers(t)
		h.dumpHistory(t)
		sameOnEveryNode(t, c)
	}
	logLeasePaths(t, c)
	if problems := check(t, c.pool, h, up, w.gemini.streamed, append(names, "org", "lorg"), parents); len(problems) > 0 {
		if f := os.Getenv("SOAK_PROBLEMS"); f != "" { // every divergence, to a file
			_ = os.WriteFile(f, []byte(strings.Join(problems, "\n")+"\n"), 0o644)
		}
		for i, p := range problems {
			if i == 10 {
				t.Errorf("... and %d more", len(problems)-10)
				break
			}
			t.Error(p)
		}
		t.Logf("the history around the first divergence:\n%s", h.around(problems[0]))
		t.Logf("the ledger of its admission:\n%s", ledgerOf(c.pool, problems[0]))
		if id := admissionIn(problems[0]); strings.HasPrefix(id, "lse_") {
			t.Logf("its lease:\n%s", leaseOf(c.pool, id))
		}
		t.Fatalf("soak: %d divergences from the model (seed %d)", len(problems), seed)
	}
	// What `tokengate ledger verify` runs (admin.Service.LedgerVerify), over
	// every tenant: each chain, and each row's head and balance against it.
	c.audit()
	watchFoundNothing(t, c)
}

// watchFoundNothing checks that no replica's invariant watch, which ran
// every second through the load and its faults, ever logged a finding on a
// ledger the audit finds sound.
func watchFoundNothing(t *testing.T, c *cluster) {
	t.Helper()
	for _, rep := range c.replicas {
		rc, err := rep.ctr.Logs(ctx)
		if err != nil {
			t.Fatalf("soak: %s's logs: %v", rep.name, err)
		}
		raw, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatalf("soak: %s's logs: %v", rep.name, err)
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.Contains(line, "LEDGER INVARIANT VIOLATED") {
				t.Fatalf("soak: %s's invariant watch found a violation in a sound ledger: %s", rep.name, line)
			}
		}
	}
}

// replicasUp checks that every replica answers again once the faults are
// over: one that is down for good would leave the rest of a run to two.
func replicasUp(t *testing.T, c *cluster) {
	t.Helper()
	for _, rep := range c.replicas {
		var err error
		if !await.For(60*time.Second, 500*time.Millisecond, func() bool {
			var resp *http.Response
			if resp, err = client.Get(rep.url + "/readyz"); err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}) {
			st, _ := rep.ctr.State(ctx)
			logs := ""
			if rc, lerr := rep.ctr.Logs(ctx); lerr == nil {
				raw, _ := io.ReadAll(rc)
				logs = string(raw[max(0, len(raw)-4000):])
			}
			t.Errorf("soak: %s does not answer at %s once the faults are over: %v; its container: %+v\n%s", rep.name, rep.url, err, st, logs)
		}
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// reconnect opens the test's pool again: a Postgres restart may have moved
// its host port. (A Patroni cluster's pool finds the primary by itself.)
func (c *cluster) reconnect(t *testing.T) {
	if c.ha != nil {
		return
	}
	dsn, err := c.pg.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c.pool, c.store = pool, account.NewStore(pool)
}

// The faces a client comes through.
const (
	faceAPI   = "api"   // the HTTP API
	faceProxy = "proxy" // the proxy: OpenAI's wire, and Gemini's (proxySeen.gemini)
	faceRLS   = "rls"   // Envoy's rate limit service
)

// event is one request a client made and the answer it saw.
type event struct {
	face             string // faceAPI, faceProxy or faceRLS
	client           int
	op               string // reserve, settle, release, adjust, limits; call (a proxy's)
	tenant, key      string // key: the Idempotency-Key as the store keeps it, if any
	body             string
	admission        string // the admission named or answered
	code             int    // HTTP's; for the RLS, see rlsClients.call
	typ              string // the error type
	applied, balance string // a settle's or release's answer
	retryAfter       string // a refusal's Retry-After
	begin, end       time.Duration
	reservedCost     int64 // the cost the client knows it reserves: told (API), estimated (proxy), hits (RLS)
	local            bool  // decided by the replica alone (the local failure policy)
	replica          string
	proxy            proxySeen
	rls              rlsSeen
}

// proxySeen is what a proxy's client knows of its call.
type proxySeen struct {
	call               string // the call's id: its plan at the upstream, and its "user"
	in, maxOut         int64  // the prompt's input tokens and max_tokens
	stream, askedUsage bool
	sawUsage, sawDone  bool // the stream carried a usage chunk; it ended
	// A Gemini call's (soak_gemini_test.go): maxOut is all the output it
	// reserved (maxOutputTokens x candidates, and the thinking budget).
	gemini    bool
	form      string // formGenerate, formSSE, formArray; "count" for countTokens
	vertex    bool   // Vertex AI's path, else AI Studio's
	keyVia    int    // the key in x-goog-api-key (0), ?key= (1), a bearer token (2)
	cands     int    // candidateCount
	sawFinish bool   // every candidate finished (sawUsage: the last response stated usageMetadata)
	retryInfo bool   // the error carried a google.rpc.RetryInfo
	counted   int64  // countTokens' totalTokens
	countedBy string // its X-Tokengate-Count
}

// rlsSeen is what a gateway knows of its call to the rate limit service.
type rlsSeen struct {
	requestID string
	hits      int64 // the cost asked (request), or the usage (stream end)
	decided   bool  // the answer carried the tenant's balance: the call was decided
	remaining int64 // its limit_remaining
}

type history struct {
	mu     sync.Mutex
	start  time.Time
	events []event
	faults [][2]time.Time // when each fault began, and when its effects were over
	// faultKinds names each fault (for SOAK_DUMP); counted is the counts
	// as of the last fault.
	faultKinds []string
	counted    map[string]int
	// failovers are the Patroni cluster's changes of leader (TestSoakHA).
	failovers []failover
	// kills are the replicas killed or cut off past the lease TTL, and
	// replicas the names of all (checkLeases: their leases).
	kills    []kill
	replicas []string
}

// fault records a fault's window, and what it was: the count that grew.
func (h *history) fault(from, to time.Time, count map[string]int, before int) {
	h.mu.Lock()
	h.faults = append(h.faults, [2]time.Time{from, to})
	kind := "none"
	total := 0
	for k, n := range count {
		total += n
		if n == h.counted[k]+1 {
			kind = k
		}
		if h.counted == nil {
			h.counted = map[string]int{}
		}
		h.counted[k] = n
	}
	if total == before {
		kind = "none"
	}
	h.faultKinds = append(h.faultKinds, kind)
	h.mu.Unlock()
}

// total is the number of faults count holds.
func total(count map[string]int) int {
	n := 0
	for _, c := range count {
		n += c
	}
	return n
}

// quiet reports whether no fault overlapped [from, to].
func (h *history) quiet(from, to time.Time) bool {
	for _, f := range h.faults {
		if f[0].Before(to) && f[1].After(from) {
			return false
		}
	}
	return true
}

func (h *history) add(e event) {
	h.mu.Lock()
	h.events = append(h.events, e)
	h.mu.Unlock()
}

// admissionIn returns the first admission id a divergence names, if any,
// or else the first lease id (whose entries name it as their admission).
func admissionIn(problem string) string {
	i := strings.Index(problem, "adm_")
	if i < 0 {
		i = strings.Index(problem, "lse_")
	}
	if i >= 0 {
		return strings.FieldsFunc(problem[i:], func(r rune) bool { return r == ' ' || r == ',' || r == ':' || r == ')' })[0]
	}
	return ""
}

// ledgerOf renders the ledger entries of the admission a divergence names.
func ledgerOf(pool *pgxpool.Pool, problem string) string {
	rows, err := pool.Query(ctx, `SELECT tenant_id, seq, kind, created_at, estimate, actual, delta_micro, balance_micro, late, actor, coalesce(reason, '')
		FROM ledger_entries WHERE admission_id = $1 ORDER BY created_at, tenant_id`, admissionIn(problem))
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	var tenant, kind, actor, reason string
	var seq, delta, balance int64
	var estimate, actual *int64
	var at time.Time
	var late bool
	_, err = pgx.ForEachRow(rows, []any{&tenant, &seq, &kind, &at, &estimate, &actual, &delta, &balance, &late, &actor, &reason}, func() error {
		fmt.Fprintf(&b, "  %s #%d %-7s %s estimate=%v actual=%v delta=%d balance=%d late=%t actor=%s %s\n", tenant, seq, kind,
			at.Format("15:04:05.000000"), deref(estimate), deref(actual), delta, balance, late, actor, reason)
		return nil
	})
	if err != nil {
		return err.Error()
	}
	return b.String()
}

// around renders the requests that named the admission a divergence
// names, or else the last ones before the end of the run.
func (h *history) around(problem string) string {
	adm := admissionIn(problem)
	var b strings.Builder
	n := 0
	for _, e := range h.events {
		if adm != "" && e.admission != adm {
			continue
		}
		fmt.Fprintf(&b, "  %8s %s-%s client %2d %-9s %-5s %-7s %-5s %s key=%q %s -> %d %s %s %s local=%t%s\n", e.begin.Round(time.Millisecond),
			h.start.Add(e.begin).Format("15:04:05.000"), h.start.Add(e.end).Format("15:04:05.000"),
			e.client, e.replica, e.face, e.op, e.tenant, e.admission, e.key, e.body, e.code, e.typ, e.applied, e.balance, e.local, e.detail())
		if n++; n > 40 {
			break
		}
	}
	return b.String()
}

type workload struct {
	c            *cluster
	proxies      *pgProxies
	provider     *provider
	rls          *rlsClients
	h            *history
	keys         map[string]string
	names        []string
	admin        string
	promptTokens []int64 // the input tokens of each prompt the proxy's clients send
	gemini       geminiMeasured
	plantAsync   bool       // SOAK_HA_PLANT=async
	mu           sync.Mutex // replicas' addresses change when a replica restarts
}

func (w *workload) replica(r *rand.Rand) *replica {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c.replicas[r.IntN(len(w.c.replicas))]
}

// pick picks a replica for a request and returns its addresses as they
// are now.
func (w *workload) pick(r *rand.Rand) replica {
	w.mu.Lock()
	defer w.mu.Unlock()
	return *w.c.replicas[r.IntN(len(w.c.replicas))]
}

// url picks a replica for a request and returns its URL and name.
func (w *workload) url(r *rand.Rand) (string, string) {
	rep := w.pick(r)
	return rep.url, rep.name
}

// send sends one request as a frontend does: JSON, with a bearer
// credential and, if idem is set, an Idempotency-Key.
func send(method, url, cred, idem, body string) (*http.Response, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+cred)
	req.Header.Set("Content-Type", "application/json")
	if idem != "" {
		req.Header.Set("Idempotency-Key", idem)
	}
	return client.Do(req)
}

// call sends one request and decodes what every answer may carry.
func call(method, url, cred, idem, body string) (code int, local bool, v struct {
	ID       string      `json:"id"`
	Applied  json.Number `json:"applied_delta"`
	Balance  json.Number `json:"balance"`
	Estimate struct {
		Cost         int64 `json:"cost"`
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	} `json:"estimate"`
	Error struct {
		Type string `json:"type"`
	} `json:"error"`
	RetryAfter string `json:"-"` // the header
}) {
	resp, err := send(method, url, cred, idem, body)
	if err != nil {
		v.Error.Type = "transport: " + err.Error()
		return 0, false, v
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &v)
	v.RetryAfter = resp.Header.Get("Retry-After")
	return resp.StatusCode, resp.Header.Get("X-Tokengate-Decided-By") == "local", v
}

// absurdUsage marks the settles that report usage no request could
// produce: each must be refused with 422 usage_out_of_bounds.
const absurdUsage = `"prompt_tokens":1000000000`

// conflictUsage is the usage of a conflicting settle of an ended
// admission: the store answers 409, having found the admission ended. Its
// output is past every soak admission's reservation (max_tokens up to
// 300), so a replica that decides alone, while its journal of the outage
// replays, and still holds the admission it made as open, refuses it as
// usage no call could have used (422 usage_out_of_bounds), as the store
// would of an open admission: both answers are right, and neither moves
// anything.
const conflictUsage = `{"usage":{"prompt_tokens":1,"completion_tokens":99999}}`

type held struct {
	tenant, id string
	cost       int64
	out        int64 // the output tokens reserved: a settle's bound
	at         time.Time
	settled    string // the usage body it was settled with, to repeat it
}

// client is one frontend: it reserves (with and without Idempotency-Keys,
// retrying errors with the same key), settles with less, equal and more
// usage than estimated (repeats, conflicts, after expiry), and releases.
func (w *workload) client(r *rand.Rand, id int, stop <-chan struct{}) {
	var open, ended []held
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		x := r.IntN(100)
		switch {
		case x < 50 || len(open) == 0:
			tenant := w.names[r.IntN(len(w.names))]
			body := fmt.Sprintf(`{"model":"gpt-4o-mini","prompt":"soak %d","max_tokens":%d}`, r.IntN(1000), 1+r.IntN(300))
			idem := ""
			if r.IntN(2) == 0 {
				idem = fmt.Sprintf("c%d-%d", id, n)
			}
			for attempt := 0; attempt < 4; attempt++ {
				e := event{face: faceAPI, client: id, op: "reserve", tenant: tenant, key: idem, body: body, begin: time.Since(w.h.start)}
				url, name := w.url(r)
				e.replica = name
				code, local, v := call("POST", url+"/v1/admissions", w.keys[tenant], idem, body)
				e.end, e.code, e.typ, e.admission, e.reservedCost, e.local = time.Since(w.h.start), code, v.Error.Type, v.ID, v.Estimate.Cost, local
				e.retryAfter = v.RetryAfter
				w.h.add(e)
				if code == http.StatusCreated {
					open = append(open, held{tenant: tenant, id: v.ID, cost: v.Estimate.Cost, out: v.Estimate.OutputTokens, at: time.Now()})
					break
				}
				if idem == "" || code != 0 && code < 500 {
					break // a rejection is final; an error without a key cannot be retried safely
				}
				clientPause(100 * time.Millisecond)
			}
		case x < 80:
			i := r.IntN(len(open))
			a := open[i]
			est := a.cost
			use := []int64{0, est / 2, est, est + 1 + int64(r.IntN(50))}[r.IntN(4)]
			// No more output than reserved (the rest is input): usage
			// within the bound a settle checks.
			out := min(use-use/3, a.out)
			usage := fmt.Sprintf(`{"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, use-out, out)
			if r.IntN(20) == 0 {
				// Usage no request could produce (issue 21): a 422 that
				// moves nothing; the admission stays open.
				w.end(r, id, a, "settle", `{"usage":{`+absurdUsage+`,"completion_tokens":1000000000}}`)
				break
			}
			if w.end(r, id, a, "settle", usage) {
				a.settled = usage
				open = append(open[:i], open[i+1:]...)
				ended = append(ended, a)
			}
		case x < 90:
			i := r.IntN(len(open))
			if w.end(r, id, open[i], "release", "") {
				open = append(open[:i], open[i+1:]...)
			}
		case x < 97 && len(ended) > 0:
			// A repeated settle (the same answer) or a conflicting one (409).
			a := ended[r.IntN(len(ended))]
			usage := a.settled
			if r.IntN(3) == 0 {
				usage = conflictUsage
			}
			w.end(r, id, a, "settle", usage)
		default:
			// Hold one past its TTL: it expires, and a late settle reconciles.
			clientPause(50 * time.Millisecond)
		}
	}
}

// end settles or releases; it reports whether the admission is ended.
func (w *workload) end(r *rand.Rand, client int, a held, op, body string) bool {
	e := event{face: faceAPI, client: client, op: op, tenant: a.tenant, admission: a.id, body: body, begin: time.Since(w.h.start)}
	url, name := w.url(r)
	e.replica = name
	code, local, v := call("POST", url+"/v1/admissions/"+a.id+"/"+op, w.keys[a.tenant], "", body)
	e.end, e.code, e.typ, e.applied, e.balance, e.local = time.Since(w.h.start), code, v.Error.Type, string(v.Applied), string(v.Balance), local
	w.h.add(e)
	return code == http.StatusOK || code == http.StatusConflict
}

// operator makes admin changes now and then: adjustments, and limit
// changes (token capacity, concurrency) that the model must follow.
func (w *workload) operator(r *rand.Rand, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(500+r.IntN(1500)) * time.Millisecond):
		}
		var op, tenant, path, body string
		switch r.IntN(3) {
		case 0:
			op, tenant = "adjust", append([]string{"org"}, w.names...)[r.IntN(len(w.names)+1)]
			path, body = "/v1/admin/tenants/"+tenant+"/adjustments", fmt.Sprintf(`{"tokens":%d,"reason":"soak"}`, r.IntN(400)-200)
		case 1:
			op, tenant = "limits", "tok"
			path, body = "/v1/admin/tenants/tok/limits", fmt.Sprintf(`{"tokens_capacity":%d}`, []int{2000, 3000, 4000}[r.IntN(3)])
		default:
			op, tenant = "limits", "conc"
			path, body = "/v1/admin/tenants/conc/limits", fmt.Sprintf(`{"max_concurrent":%d}`, 2+r.IntN(5))
		}
		e := event{face: faceAPI, client: -1, op: op, tenant: tenant, body: body, begin: time.Since(w.h.start)}
		method := "POST"
		if op == "limits" {
			method = "PATCH"
		}
		url, _ := w.url(r)
		code, _, v := call(method, url+path, w.admin, "", body)
		e.end, e.code, e.typ = time.Since(w.h.start), code, v.Error.Type
		w.h.add(e)
	}
}

// faults strikes at random moments: Postgres paused (SIGSTOP, docker
// pause) and resumed, Postgres restarted, a replica killed and started
// again (always the first fault), a replica cut off the network and
// connected again, a replica's connections to Postgres cut at the TCP
// proxy (for longer than the lease TTL: always the second fault), Postgres's answers to a
// replica delayed at the proxy, and Postgres slow for one tenant (its row
// held by another transaction).
func (w *workload) faults(t *testing.T, r *rand.Rand, stop <-chan struct{}, count map[string]int) {
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(3000+r.IntN(4000)) * time.Millisecond):
		}
		if n == 0 {
			// The first fault kills a replica holding leases it admits
			// from (soak_lease_test.go).
			if ok, waited := w.leasesInUse(stop, 30*time.Second); !ok {
				t.Logf("soak: the first fault strikes after %s with not every replica admitting from a lease", waited.Round(100*time.Millisecond))
			}
		}
		began, before := time.Now(), total(count)
		// A fault's effects last until the replicas have their
		// connections back: 3 s after it ends.
		func() {
			defer func() { w.h.fault(began, time.Now().Add(3*time.Second), count, before) }()
			k := r.IntN(8)
			switch n {
			case 0:
				k = 2 // every run kills a replica holding leases
			case 1:
				k = 7 // and cuts one off past its leases' TTL
			}
			switch k {
			case 0:
				docker(t, "pause", w.c.pg.GetContainerID())
				time.Sleep(time.Duration(500+r.IntN(2500)) * time.Millisecond) // real time: how long Postgres stays paused is the fault
				docker(t, "unpause", w.c.pg.GetContainerID())
				count["postgres paused"]++
			case 1:
				docker(t, "restart", "--time", "1", w.c.pg.GetContainerID())
				w.c.reconnect(t) // its host port may have moved
				w.proxies.retarget(w.c, "")
				count["postgres restarted"]++
			case 7:
				// A replica's connections cut for longer than the lease
				// TTL: its leases expire by the store's clock with its
				// admissions in flight; the journal refuses them, and the
				// other replicas' sweepers give the budget back.
				rep := w.replica(r)
				w.h.mu.Lock()
				w.h.kills = append(w.h.kills, kill{replica: rep.name, before: time.Now(), at: time.Now(), faultWindows: len(w.h.faults), cut: true})
				w.h.mu.Unlock()
				w.proxies.cut(rep.name, leaseTTL+time.Duration(500+r.IntN(2000))*time.Millisecond)
				count["connections cut past the lease TTL (proxy)"]++
			default:
				w.sharedFault(t, r, k, count)
			}
		}()
	}
}

// sharedFault strikes one of the faults that do not touch the store's own
// containers, the same on one Postgres and on a Patroni cluster: k is 5 for
// a replica's connections cut at its proxies, 6 for Postgres's answers to
// a replica slowed there, 3 for a replica partitioned, 4 for one tenant's
// row held, anything else for a replica killed and started again.
func (w *workload) sharedFault(t *testing.T, r *rand.Rand, k int, count map[string]int) {
	switch k {
	case 5:
		rep := w.replica(r)
		w.proxies.cut(rep.name, time.Duration(200+r.IntN(2000))*time.Millisecond)
		count["connections cut (proxy)"]++
	case 6:
		rep := w.replica(r)
		w.proxies.slow(rep.name, time.Duration(50+r.IntN(400))*time.Millisecond, 100*time.Millisecond,
			time.Duration(1000+r.IntN(3000))*time.Millisecond)
		count["postgres slow (proxy latency)"]++
	case 3:
		// A replica cut off from the network (a partition): its
		// connections to Postgres and its clients' die mid-flight.
		rep := w.replica(r)
		docker(t, "network", "disconnect", w.c.net.Name, rep.ctr.GetContainerID())
		time.Sleep(time.Duration(500+r.IntN(2500)) * time.Millisecond) // real time: how long the partition lasts is the fault
		docker(t, "network", "connect", w.c.net.Name, rep.ctr.GetContainerID())
		// Connected again, its published ports are new ones.
		w.mu.Lock()
		if err := rep.locate(); err != nil {
			t.Logf("soak: %s connected again: %v", rep.name, err)
		}
		w.mu.Unlock()
		count["replica partitioned"]++
	case 4:
		// Slow responses: a transaction holds the row of one tenant
		// for a while, so every decision touching it waits its turn.
		tenant := []string{"tok", "req", "conc", "per", "loc", "org"}[r.IntN(6)]
		hold := time.Duration(300+r.IntN(2200)) * time.Millisecond
		func() {
			tx, err := w.c.pool.Begin(ctx)
			if err != nil {
				return // Postgres restarting: no fault this time
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, `SELECT 1 FROM tenants WHERE id = $1 FOR UPDATE`, tenant); err != nil {
				return
			}
			time.Sleep(hold) // real time: how long the row lock is held is the fault
		}()
		count["postgres slow (row held)"]++
	default:
		rep := w.replica(r)
		before := time.Now()
		docker(t, "kill", rep.ctr.GetContainerID())
		w.h.mu.Lock()
		w.h.kills = append(w.h.kills, kill{replica: rep.name, before: before, at: time.Now(), faultWindows: len(w.h.faults)})
		w.h.mu.Unlock()
		time.Sleep(time.Duration(200+r.IntN(1000)) * time.Millisecond) // real time: how long the replica stays dead is the fault
		docker(t, "start", rep.ctr.GetContainerID())
		w.mu.Lock()
		if err := rep.locate(); err != nil {
			t.Logf("soak: %s started again: %v", rep.name, err)
		}
		w.mu.Unlock()
		count["replica killed"]++
	}
}
