package alert_test

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/await"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// receiver is a webhook receiver as a user would write one: it verifies
// the signature and deduplicates by event id.
type receiver struct {
	t      *testing.T
	secret string
	mu     sync.Mutex
	seen   map[string]int // event id -> deliveries that verified
	bodies map[string]string
	bad    int // deliveries whose signature did not verify
	// behave answers the n-th request (from 1); nil answers 200.
	behave func(n int64, w http.ResponseWriter) bool
	n      atomic.Int64
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := rc.n.Add(1)
	body, _ := io.ReadAll(r.Body)
	if rc.behave != nil && !rc.behave(n, w) {
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	id := r.Header.Get(alert.HeaderEventID)
	var b alert.Body
	if err := alert.Verify(rc.secret, r.Header.Get(alert.HeaderSignature), body, 5*time.Minute, time.Now()); err != nil ||
		json.Unmarshal(body, &b) != nil || b.ID != id {
		rc.bad++
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if prev, ok := rc.bodies[id]; ok && prev != string(body) {
		rc.t.Errorf("event %s delivered with two bodies:\n%s\n%s", id, prev, body)
	}
	rc.seen[id]++
	rc.bodies[id] = string(body)
	w.WriteHeader(http.StatusNoContent)
}

// outbox makes a tenant, an endpoint at url, and n invariant rules on it,
// and raises their events (one per rule) through the ledger watch's path.
// Its store allows private addresses: the receivers listen on loopback.
func outbox(t *testing.T, pool *pgxpool.Pool, url string, n int) (*alert.Store, string) {
	t.Helper()
	if _, err := account.NewStore(pool).CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 10, TokensRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	s := alert.NewStore(pool, testKey)
	s.AllowPrivate = true // the receivers listen on loopback
	ep, secret, err := s.CreateEndpoint(ctx, url, "")
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		if _, err := s.CreateRule(ctx, alert.RuleParams{TenantID: "acme", EndpointID: ep.ID, Kind: alert.KindInvariant}); err != nil {
			t.Fatal(err)
		}
	}
	if raised, err := s.RaiseInvariant(ctx, "acme", 7, "balance 10 but the ledger says 11"); err != nil || raised != int64(n) {
		t.Fatalf("raised %d (%v), want %d", raised, err, n)
	}
	// The same finding again (another replica's watch, the next run): nothing.
	if raised, err := s.RaiseInvariant(ctx, "acme", 7, "balance 10 but the ledger says 11"); err != nil || raised != 0 {
		t.Fatalf("raised again: %d %v", raised, err)
	}
	return s, secret
}

// TestDeliveryThroughDownSlowFailingReceiver: the receiver is down (nothing
// listens), then slow (past the client's timeout), then answers 500, then
// recovers. The event is retried with growing, jittered waits, each attempt
// is logged with its outcome, and it is recorded delivered once.
func TestDeliveryThroughDownSlowFailingReceiver(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // down: connections are refused
	s, secret := outbox(t, pool, "https://"+addr+"/hook", 1)

	rc := &receiver{t: t, secret: secret, seen: map[string]int{}, bodies: map[string]string{}}
	rc.behave = func(n int64, w http.ResponseWriter) bool {
		switch n {
		case 1: // slow: answers after the dispatcher gave up waiting
			time.Sleep(3 * time.Second) // real time: the client's real-clock timeout (2 s) is what is tested
			return true
		case 2:
			w.WriteHeader(http.StatusInternalServerError)
			return false
		}
		return true
	}
	srv := httptest.NewUnstartedServer(rc)
	// A timeout a stalled machine's TLS request still makes: at 300 ms, the
	// 500 and the delivery that follow the slow answer could time out too.
	client := &http.Client{Timeout: 2 * time.Second}
	d := &alert.Dispatcher{Store: s, Replica: "r1", Client: client, Lease: 5 * time.Second, Base: 100 * time.Millisecond, Max: time.Second}

	once := func() int {
		n, err := d.Once(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := once(); n != 0 {
		t.Fatalf("delivered %d with nothing listening", n)
	}
	// After the first (refused) attempt, the receiver comes up on its
	// address.
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = l
	srv.StartTLS()
	defer srv.Close()
	client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}}
	// Each round delivers what is due: the backoffs are on Postgres's
	// clock, so the test asks until the event is delivered.
	await.UntilEvery(t, 20*time.Second, 20*time.Millisecond, "the delivery", func() bool { return once() == 1 }, nil)
	es := events(t, s, "acme")
	if len(es) != 1 || es[0].State != "delivered" || es[0].DeliveredAt == nil || es[0].Attempts != 4 {
		t.Fatalf("event: %+v", es)
	}
	log := es[0].Log
	want := []struct {
		outcome string
		status  int
	}{{"failed", 0}, {"failed", 0}, {"failed", 500}, {"delivered", 204}}
	for i, a := range log {
		st := 0
		if a.StatusCode != nil {
			st = *a.StatusCode
		}
		if i >= len(want) || a.Outcome != want[i].outcome || st != want[i].status || a.Replica != "r1" || a.FinishedAt == nil {
			t.Fatalf("attempt %d: %+v (error %q); want %+v", i+1, a, deref(a.Error), want)
		}
		if i > 0 {
			// The wait after the i-th failure: at least half of 100 ms × 2^(i-1).
			least := time.Duration(50<<(i-1)) * time.Millisecond
			if gap := a.StartedAt.Sub(*log[i-1].FinishedAt); gap < least {
				t.Fatalf("attempt %d began %s after attempt %d ended; the backoff is at least %s", i+1, gap, i, least)
			}
		}
	}
	if deref(log[1].Error) != "no answer within the timeout" || deref(log[2].Error) != "answered 500" {
		t.Fatalf("errors: %q, %q", deref(log[1].Error), deref(log[2].Error))
	}
	srv.Close() // waits for the slow handler, which outlives its attempt
	rc.mu.Lock()
	defer rc.mu.Unlock()
	// The slow attempt reached the receiver too: at least once, and the
	// receiver deduplicates by id.
	if rc.bad != 0 || rc.seen[es[0].ID] != 2 {
		t.Fatalf("receiver: %d bad signatures, saw the event %d times (want 2: the slow one and the last)", rc.bad, rc.seen[es[0].ID])
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// TestGiveUpThenRedeliver: an event older than GiveUpAfter is recorded
// failed after its attempt; an admin redelivers it, and it is delivered.
// Delivered events cannot be redelivered.
func TestGiveUpThenRedeliver(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	var fail atomic.Bool
	fail.Store(true)
	rc := &receiver{t: t, seen: map[string]int{}, bodies: map[string]string{}, behave: func(_ int64, w http.ResponseWriter) bool {
		if fail.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return false
		}
		return true
	}}
	srv := httptest.NewTLSServer(rc)
	defer srv.Close()
	s, secret := outbox(t, pool, srv.URL, 1)
	rc.secret = secret
	d := &alert.Dispatcher{Store: s, Replica: "r1", Client: srv.Client(), GiveUpAfter: time.Nanosecond}
	if n, err := d.Once(ctx); err != nil || n != 0 {
		t.Fatalf("once: %d %v", n, err)
	}
	es := events(t, s, "acme")
	if es[0].State != "failed" || len(es[0].Log) != 1 || es[0].Log[0].Outcome != "failed" {
		t.Fatalf("after giving up: %+v", es[0])
	}
	if n, _ := d.Once(ctx); n != 0 {
		t.Fatal("a failed event was retried")
	}
	fail.Store(false)
	if err := s.Redeliver(ctx, es[0].ID); err != nil {
		t.Fatal(err)
	}
	if n, err := d.Once(ctx); err != nil || n != 1 {
		t.Fatalf("redelivered: %d %v", n, err)
	}
	if err := s.Redeliver(ctx, es[0].ID); !errors.Is(err, alert.ErrNotFound) {
		t.Fatalf("redeliver a delivered event: %v", err)
	}
}

// TestTwoDispatchersDeliverEachEventOnce: two replicas (two pools)
// dispatch 60 events at once. Each event is delivered, recorded delivered
// exactly once (one attempt with that outcome), and both replicas share
// the work.
func TestTwoDispatchersDeliverEachEventOnce(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	p1, p2 := pgtest.Pool(t, url, nil), pgtest.Pool(t, url, nil)
	rc := &receiver{t: t, seen: map[string]int{}, bodies: map[string]string{}, behave: func(int64, http.ResponseWriter) bool {
		// real time: a delivery takes a while, as a receiver's does, so
		// that both dispatchers have work leased at once.
		time.Sleep(10 * time.Millisecond)
		return true
	}}
	srv := httptest.NewTLSServer(rc)
	defer srv.Close()
	s1, secret := outbox(t, p1, srv.URL, 60)
	rc.secret = secret
	s2 := alert.NewStore(p2, testKey)
	s2.AllowPrivate = true
	var wg sync.WaitGroup
	delivered := map[string]int{}
	var mu sync.Mutex
	delivering := make(chan struct{}) // closed, and made anew, at each round that delivers
	for i, s := range []*alert.Store{s1, s2} {
		d := &alert.Dispatcher{Store: s, Replica: []string{"r1", "r2"}[i], Client: srv.Client(), Batch: 4}
		wg.Go(func() {
			for range 100 {
				n, err := d.Once(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				delivered[d.Replica] += n
				total := delivered["r1"] + delivered["r2"]
				if n > 0 {
					close(delivering)
					delivering = make(chan struct{})
				}
				next := delivering
				mu.Unlock()
				if total >= 60 {
					return
				}
				if n == 0 {
					// Nothing due here: the other replica holds the rest.
					// Ask again once it delivers (or after a second, in
					// case it is between rounds too).
					select {
					case <-next:
					case <-time.After(time.Second):
					}
				}
			}
		})
	}
	wg.Wait()
	es := events(t, s1, "acme")
	byReplica := map[string]int{}
	for _, e := range es {
		n := 0
		for _, a := range e.Log {
			if a.Outcome == "delivered" {
				n++
				byReplica[a.Replica]++
			}
		}
		if e.State != "delivered" || n != 1 {
			t.Fatalf("event %s: state %s, recorded delivered %d times: %+v", e.ID, e.State, n, e.Log)
		}
		rc.mu.Lock()
		if rc.seen[e.ID] != 1 {
			t.Errorf("event %s reached the receiver %d times", e.ID, rc.seen[e.ID])
		}
		rc.mu.Unlock()
	}
	if len(es) != 60 || byReplica["r1"] == 0 || byReplica["r2"] == 0 || byReplica["r1"]+byReplica["r2"] != 60 {
		t.Fatalf("%d events; delivered by replica %v", len(es), byReplica)
	}
}

// TestLeaseRunsOutAnotherReplicaDelivers: a replica leases an event and
// stops (it never records an outcome, as if killed). Once the lease runs
// out another replica delivers it; the first attempt is recorded
// abandoned. A late answer of the first replica records it superseded and
// does not deliver it twice in the log.
func TestLeaseRunsOutAnotherReplicaDelivers(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	release, arrived := make(chan struct{}), make(chan struct{})
	rc := &receiver{t: t, seen: map[string]int{}, bodies: map[string]string{}, behave: func(n int64, w http.ResponseWriter) bool {
		if n == 1 {
			close(arrived)
			<-release // the first replica's request hangs
		}
		return true
	}}
	srv := httptest.NewTLSServer(rc)
	defer srv.Close()
	s, secret := outbox(t, pool, srv.URL, 1)
	rc.secret = secret
	stuck := &alert.Dispatcher{Store: s, Replica: "r1", Client: srv.Client(), Lease: 300 * time.Millisecond}
	done := make(chan int)
	go func() {
		n, err := stuck.Once(ctx)
		if err != nil {
			t.Error(err)
		}
		done <- n
	}()
	// r1 leased the event before its request arrived: its lease runs from
	// then, not from when its goroutine was started (which a stalled
	// machine may run late).
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("r1's request never arrived")
	}
	time.Sleep(500 * time.Millisecond) // real time: past r1's lease (300 ms), which runs out on Postgres's clock
	other := &alert.Dispatcher{Store: s, Replica: "r2", Client: srv.Client()}
	if n, err := other.Once(ctx); err != nil || n != 1 {
		t.Fatalf("r2: %d %v", n, err)
	}
	close(release)
	if n := <-done; n != 0 {
		t.Fatalf("r1's late answer counted as a delivery: %d", n)
	}
	es := events(t, s, "acme")
	log := es[0].Log
	if es[0].State != "delivered" || len(log) != 2 || log[0].Replica != "r1" || log[0].Outcome != "superseded" ||
		log[1].Replica != "r2" || log[1].Outcome != "delivered" {
		t.Fatalf("log: %+v", log)
	}
}
