package api_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/outage"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/await"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

// proxy stands between a replica and Postgres so a test can cut the store
// off: cut closes every connection and refuses new ones, restore lets them
// through again.
type proxy struct {
	ln      net.Listener
	target  string
	blocked atomic.Bool
	mu      sync.Mutex
	conns   []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if p.blocked.Load() {
				_ = c.Close()
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); p.cut() })
	return p
}

func (p *proxy) cut() {
	p.blocked.Store(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

func (p *proxy) restore() { p.blocked.Store(false) }

type outageBundle struct {
	*apiBundle
	proxy *proxy
	local *outage.Local
	est   *estimator.Estimator
	stop  func()
}

// setupOutage runs a replica whose pool reaches Postgres through a proxy.
func setupOutage(t *testing.T, policy rule.Policy, models []estimator.Model, opts ...func(*testConfig)) *outageBundle {
	t.Helper()
	dbURL := pgtest.URL(t)
	direct := pgtest.Pool(t, dbURL, nil)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, u.Host)
	u.Host = p.ln.Addr().String()
	q := u.Query()
	q.Set("connect_timeout", "1")
	u.RawQuery = q.Encode()
	pool := pgtest.Pool(t, u.String(), nil)
	spool, err := outage.OpenSpool(t.TempDir(), "replica-a")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = spool.Close() })
	local := &outage.Local{Replicas: 2, Replica: "replica-a", Spool: spool}
	est := estimator.New(nil)
	if models != nil {
		table, err := estimator.DefaultTable().With(models)
		if err != nil {
			t.Fatal(err)
		}
		est.SetTable(table)
	}
	cfg := &testConfig{replicaConfig: replica.Config{DB: pool, Estimator: est, DefaultPolicy: policy, Local: local, StoreTimeout: time.Second}}
	for _, o := range opts {
		o(cfg)
	}
	srv, rep := newServer(t, cfg)
	recCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for recCtx.Err() == nil {
			rep.Admitter.RecoverOnce(recCtx)
			select {
			case <-recCtx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	b := &outageBundle{apiBundle: &apiBundle{pool: direct, srv: srv, store: account.NewStore(direct)}, proxy: p, local: local, est: est}
	b.stop = func() { cancel(); <-done }
	t.Cleanup(b.stop)
	return b
}

func (b *outageBundle) waitStoreUp(t *testing.T) {
	t.Helper()
	await.Until(t, 10*time.Second, "the replica to recover the store", func() bool {
		r := b.call(t, "", http.MethodGet, "/metrics", "")
		if !strings.Contains(r.Body.String(), "\ntokengate_store_up 1\n") { // not the HELP line
			return false
		}
		n, _ := b.local.Spool.Len()
		return n == 0
	}, nil)
}

func TestStoreUnavailableRejectPolicy(t *testing.T) {
	t.Parallel()
	b := setupOutage(t, rule.PolicyReject, nil)
	key := b.tenant(t, "acme", lim(10_000, "1"))
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(10, "x")); r.Code != http.StatusCreated {
		t.Fatalf("before: %d %s", r.Code, r.Body)
	}
	b.proxy.cut()
	start := time.Now()
	r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(10, "x"))
	if r.Code != http.StatusServiceUnavailable || r.errorBody().Error.Type != "store_unavailable" || r.Header().Get("Retry-After") != "1" {
		t.Fatalf("during the outage: %d %s %v", r.Code, r.Body, r.Header())
	}
	if time.Since(start) > 3*time.Second {
		t.Fatalf("the 503 took %s", time.Since(start))
	}
	// Once marked down, requests do not wait on the store at all: well
	// under its 1 s timeout, with room for a stalled machine (not 200 ms).
	start = time.Now()
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(10, "x")); r.Code != http.StatusServiceUnavailable || time.Since(start) > 900*time.Millisecond {
		t.Fatalf("second request: %d after %s", r.Code, time.Since(start))
	}
	b.proxy.restore()
	b.waitStoreUp(t)
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(10, "x")); r.Code != http.StatusCreated {
		t.Fatalf("after: %d %s", r.Code, r.Body)
	}
	if _, seq := b.balance(t, "acme"); seq != 3 {
		t.Fatalf("ledger has %d entries, want creation and two reserves", seq)
	}
}

func TestStoreUnavailableLocalPolicyReplaysExactlyOnce(t *testing.T) {
	t.Parallel()
	b := setupOutage(t, rule.PolicyLocal, nil)
	// 2000 tokens over 2 replicas: this replica's share is 1000, refilling
	// 0.05/s (nothing, over the test).
	key := b.tenant(t, "acme", lim(2_000, "0.1"))
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "x")); r.Code != http.StatusCreated {
		t.Fatal(r.Body)
	}
	b.proxy.cut()
	var local []string
	var rejected int
	for range 12 {
		r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(100, "x")) // 108 each
		switch r.Code {
		case http.StatusCreated:
			var a admitted
			r.json(&a)
			if r.Header().Get("X-Tokengate-Decided-By") != "local" {
				t.Fatal("an outage admission is not marked local")
			}
			local = append(local, a.ID)
		case http.StatusTooManyRequests:
			rejected++
		default:
			t.Fatalf("during the outage: %d %s", r.Code, r.Body)
		}
	}
	// The share held (2000 - 108) / 2 = 946 tokens: 8 admissions of 108.
	if len(local) != 8 || rejected != 4 {
		t.Fatalf("%d admitted locally, %d rejected; want 8 and 4", len(local), rejected)
	}
	// A settle during the outage is journaled: 202.
	r := b.call(t, key, http.MethodPost, "/v1/admissions/"+local[0]+"/settle", `{"usage":{"prompt_tokens":8,"completion_tokens":20}}`)
	if r.Code != http.StatusAccepted || !strings.Contains(r.Body.String(), `"pending"`) {
		t.Fatalf("settle during the outage: %d %s", r.Code, r.Body)
	}
	// An idempotent retry to this replica gets the same local admission.
	k1 := b.call(t, key, http.MethodPost, "/v1/admissions", chat(1, "y"), "Idempotency-Key", "k-1")
	k2 := b.call(t, key, http.MethodPost, "/v1/admissions", chat(1, "y"), "Idempotency-Key", "k-1")
	if k1.Code != 201 || k2.Code != 201 || k1.Body.String() != k2.Body.String() {
		t.Fatalf("idempotent retry during the outage:\n%s\n%s", k1.Body, k2.Body)
	}
	// The key with another request is refused during the outage too.
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(2, "y"), "Idempotency-Key", "k-1"); r.Code != http.StatusConflict {
		t.Fatalf("key reused for another request during the outage: %d %s", r.Code, r.Body)
	}

	b.proxy.restore()
	b.waitStoreUp(t)
	entries, _, err := ledger.EntryQuery(ctx, b.pool, ledger.Filter{TenantID: "acme", Kind: ledger.KindReserve, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]int{}
	for _, e := range entries {
		byID[e.AdmissionID]++
	}
	for _, id := range local {
		if byID[id] != 1 {
			t.Fatalf("local admission %s is in the ledger %d times", id, byID[id])
		}
	}
	if len(entries) != 1+8+1 {
		t.Fatalf("%d reserve entries, want 10", len(entries))
	}
	// A retry of the keyed request after the outage returns the local
	// admission, without a second debit.
	tokensBefore, _ := b.balance(t, "acme")
	k3 := b.call(t, key, http.MethodPost, "/v1/admissions", chat(1, "y"), "Idempotency-Key", "k-1")
	var first, again admitted
	k1.json(&first)
	k3.json(&again)
	if k3.Code != http.StatusCreated || again.ID != first.ID || k3.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after the replay: %d %s; want admission %s replayed", k3.Code, k3.Body, first.ID)
	}
	if tokensAfter, _ := b.balance(t, "acme"); tokensAfter != tokensBefore {
		t.Fatalf("the retry after the replay debited: %d -> %d", tokensBefore, tokensAfter)
	}
	a, err := b.store.AdmissionGet(ctx, "acme", local[0])
	if err != nil || a.State != account.StateSettled || *a.ActualCost != 28 {
		t.Fatalf("the journaled settle: %+v %v", a, err)
	}
	if _, err := ledger.Verify(ctx, b.pool, "acme"); err != nil {
		t.Fatal(err)
	}
	// Back to the store: admissions are the store's again.
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(1, "z")); r.Code != 201 || r.Header().Get("X-Tokengate-Decided-By") != "" {
		t.Fatalf("after recovery: %d %v", r.Code, r.Header())
	}
}

func TestFailurePolicyPerModel(t *testing.T) {
	t.Parallel()
	models := []estimator.Model{
		{Name: "cheap", Encoding: estimator.EncodingO200K, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne,
			DefaultOutputTokens: 1000, ContextWindow: 8000, PartTokens: 100, OnStoreUnavailable: "local"},
		{Name: "costly", Encoding: estimator.EncodingO200K, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: 4 * estimator.WeightOne,
			DefaultOutputTokens: 1000, ContextWindow: 8000, PartTokens: 100},
	}
	b := setupOutage(t, rule.PolicyReject, models)
	key := b.tenant(t, "acme", lim(100_000, "1"))
	body := func(model string) string {
		return `{"model":"` + model + `","messages":[{"role":"user","content":"x"}],"max_tokens":10}`
	}
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", body("costly")); r.Code != 201 {
		t.Fatal(r.Body)
	}
	b.proxy.cut()
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", body("cheap")); r.Code != http.StatusCreated {
		t.Fatalf("cheap model (local) during the outage: %d %s", r.Code, r.Body)
	}
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", body("costly")); r.Code != http.StatusServiceUnavailable {
		t.Fatalf("costly model (reject) during the outage: %d %s", r.Code, r.Body)
	}
	b.proxy.restore()
	b.waitStoreUp(t)
	var reserves int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE kind = 'reserve'`).Scan(&reserves); err != nil || reserves != 2 {
		t.Fatalf("%d reserves (%v), want 2", reserves, err)
	}
}

// flakyReplay makes the first replays of a spool fail as if the store went
// away again each time.
type flakyReplay struct {
	*account.Store
	failures atomic.Int64
}

func (f *flakyReplay) ReplayReserve(ctx context.Context, p account.ReplayReserveParams) (bool, error) {
	if f.failures.Add(-1) >= 0 {
		return false, fmt.Errorf("%w: injected", rule.ErrUnavailable)
	}
	return f.Store.ReplayReserve(ctx, p)
}

// TestReplayFailureIsAMetricAndNotReady: while the spool cannot be replayed
// into a store that answers pings, /readyz says so and the failures are
// counted; once a replay succeeds the replica is ready again.
func TestReplayFailureIsAMetricAndNotReady(t *testing.T) {
	t.Parallel()
	flaky := &flakyReplay{}
	b := setupOutage(t, rule.PolicyLocal, nil, func(c *testConfig) {
		flaky.Store = account.NewStore(c.DB)
		flaky.failures.Store(1 << 30) // fail until told otherwise
		c.Admissions = flaky
	})
	key := b.tenant(t, "acme", lim(2_000, "1"))
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(10, "x")); r.Code != http.StatusCreated {
		t.Fatal(r.Body)
	}
	b.proxy.cut()
	if r := b.call(t, key, http.MethodPost, "/v1/admissions", chat(10, "x")); r.Code != http.StatusCreated {
		t.Fatalf("local admission: %d %s", r.Code, r.Body)
	}
	b.proxy.restore()
	var r response
	await.Until(t, 10*time.Second, "a readiness signal of the failing replay", func() bool {
		r = b.call(t, "", http.MethodGet, "/readyz", "")
		m := b.call(t, "", http.MethodGet, "/metrics", "")
		return r.Code == http.StatusServiceUnavailable && strings.Contains(r.Body.String(), "could not be replayed") &&
			!strings.Contains(m.Body.String(), "\ntokengate_spool_replay_failures_total 0\n")
	}, func() string { return fmt.Sprintf("%d %s", r.Code, r.Body) })
	flaky.failures.Store(0)
	b.waitStoreUp(t)
	await.Until(t, 10*time.Second, "readiness after a successful replay", func() bool {
		r = b.call(t, "", http.MethodGet, "/readyz", "")
		return r.Code == http.StatusOK
	}, func() string { return fmt.Sprintf("%d %s", r.Code, r.Body) })
	if _, seq := b.balance(t, "acme"); seq != 3 {
		t.Fatalf("%d ledger entries; want creation and two reserves", seq)
	}
}

// An admin request while the store does not answer is a 503 the admin can
// retry, never a 500 (the soak met it during a Postgres restart).
func TestAdminDuringOutageIs503(t *testing.T) {
	t.Parallel()
	b := setupOutage(t, rule.PolicyReject, nil)
	b.tenant(t, "acme", lim(10_000, "1"))
	token := b.admin(t, "ops")
	if r := b.adminCall(t, token, http.MethodGet, "/v1/admin/tenants", nil); r.Code != http.StatusOK {
		t.Fatalf("before: %d %s", r.Code, r.Body)
	}
	b.proxy.cut()
	for _, call := range [][3]string{
		{http.MethodGet, "/v1/admin/tenants", ""},
		{http.MethodPost, "/v1/admin/tenants/acme/adjustments", `{"tokens":5,"reason":"x"}`},
		{http.MethodPatch, "/v1/admin/tenants/acme/limits", `{"tokens_capacity":5}`},
	} {
		r := b.adminCall(t, token, call[0], call[1], call[2])
		if r.Code != http.StatusServiceUnavailable || r.errorBody().Error.Type != "store_unavailable" {
			t.Fatalf("%s %s during the outage: %d %s", call[0], call[1], r.Code, r.Body)
		}
	}
}

// TestSettleOfALocalAdmissionNotYetReplayed: an admission a replica made
// on its own during an outage is unknown to the store until that replica
// replays its spool. A settle or release of it sent elsewhere meanwhile
// answers 503 admission_not_replayed with Retry-After (retry, it will
// land), not 404; an unknown id the store made answers 404.
func TestSettleOfALocalAdmissionNotYetReplayed(t *testing.T) {
	t.Parallel()
	b := setupAPI(t, nil)
	key := b.tenant(t, "acme", lim(1000, "1"))
	local := rule.NewLocalAdmissionID(time.Now())
	if at, ok := rule.LocalAdmissionTime(local); !ok || time.Since(at) > time.Second {
		t.Fatalf("local id %s: %v %v", local, at, ok)
	}
	for _, op := range []string{"settle", "release"} {
		r := b.call(t, key, http.MethodPost, "/v1/admissions/"+local+"/"+op, `{"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
		if op == "release" {
			r = b.call(t, key, http.MethodPost, "/v1/admissions/"+local+"/"+op, "")
		}
		if r.Code != http.StatusServiceUnavailable || r.errorBody().Error.Type != "admission_not_replayed" || r.Header().Get("Retry-After") == "" {
			t.Fatalf("%s of a local admission not replayed: %d %s %v", op, r.Code, r.Body, r.Header())
		}
	}
	// An id the store made (or a local one from days ago) is simply unknown.
	var adm struct{ ID string }
	b.call(t, key, http.MethodPost, "/v1/admissions", chat(5, "x")).json(&adm)
	if _, ok := rule.LocalAdmissionTime(adm.ID); ok || adm.ID == "" {
		t.Fatalf("the store's id %q reads as local", adm.ID)
	}
	for _, id := range []string{adm.ID[:len(adm.ID)-1] + "0", rule.NewLocalAdmissionID(time.Now().Add(-48 * time.Hour))} {
		if id == adm.ID {
			continue
		}
		if r := b.call(t, key, http.MethodPost, "/v1/admissions/"+id+"/release", ""); r.Code != http.StatusNotFound {
			t.Fatalf("release of unknown %s: %d %s", id, r.Code, r.Body)
		}
	}
}
