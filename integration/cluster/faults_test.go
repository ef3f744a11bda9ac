//go:build cluster

package cluster_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// TestPostgresPausedUnderEachPolicy pauses Postgres in the middle of load on
// two tenants: "strict" (reject) and "lenient" (local). While it is paused,
// strict gets 503 store_unavailable and lenient keeps being admitted against
// each replica's share. Once it is back, every admission any client was told
// about is in the ledger exactly once, and the ledger recomputes.
func TestPostgresPausedUnderEachPolicy(t *testing.T) {
	c := newCluster(t, 2, map[string]string{
		"TOKENGATE_REPLICAS": "2", "TOKENGATE_SPOOL_DIR": "/spool", "TOKENGATE_STORE_TIMEOUT": "1s",
	})
	strict := c.tenant("strict", rule.Limits{TokensCapacity: 5000, TokensRateMicro: 2000 * rule.Micro, OnStoreUnavailable: rule.PolicyReject})
	lenient := c.tenant("lenient", rule.Limits{TokensCapacity: 5000, TokensRateMicro: 2000 * rule.Micro, OnStoreUnavailable: rule.PolicyLocal})

	stop := make(chan struct{})
	strictRun := startLoad(c.replicas, strict, 4, 20, stop)
	lenientRun := startLoad(c.replicas, lenient, 4, 20, stop)
	// seen reports whether every replica gave, since the from-th answer,
	// an answer that ok holds for.
	seen := func(l *loadRun, from int, ok func(answer) bool) bool {
		by := map[string]bool{}
		for _, a := range l.answers()[from:] {
			if ok(a) {
				by[a.replica] = true
			}
		}
		return len(by) == len(c.replicas)
	}
	admitted := func(a answer) bool { return a.code == http.StatusCreated && !a.local }
	waitFor(t, "both replicas to know both tenants (a 201 of each)", 60*time.Second, func() bool {
		return seen(strictRun, 0, admitted) && seen(lenientRun, 0, admitted)
	})
	docker(t, "pause", c.pg.GetContainerID())
	paused := [2]int{len(strictRun.answers()), len(lenientRun.answers())}
	// Paused until each replica has answered by each policy: a 503 for the
	// strict tenant, an admission made locally for the lenient one.
	waitFor(t, "each replica to answer by the failure policies", 60*time.Second, func() bool {
		return seen(strictRun, paused[0], func(a answer) bool { return a.code == http.StatusServiceUnavailable && a.typ == "store_unavailable" }) &&
			seen(lenientRun, paused[1], func(a answer) bool { return a.code == http.StatusCreated && a.local })
	})
	docker(t, "unpause", c.pg.GetContainerID())
	back := [2]int{len(strictRun.answers()), len(lenientRun.answers())}
	waitFor(t, "both replicas to admit both tenants from the store again", 60*time.Second, func() bool {
		return seen(strictRun, back[0], admitted) && seen(lenientRun, back[1], admitted)
	})
	close(stop)
	strictAnswers, lenientAnswers := strictRun.wait(), lenientRun.wait()

	// A pause can also catch a COMMIT in flight: that request is told the
	// outcome is unknown (503 store_outcome_unknown) and may or may not be
	// in the ledger; the client would retry it with its Idempotency-Key.
	count := func(as []answer) (ok, local, unavailable, unknown int, ids []string) {
		for _, a := range as {
			switch {
			case a.code == http.StatusServiceUnavailable && a.typ == "store_outcome_unknown":
				unknown++
			case a.code == http.StatusServiceUnavailable && a.typ == "store_busy":
				// As Postgres comes back, connections the pool began during the
				// pause are still timing out: a clear 503, and nothing written.
			case a.code == http.StatusCreated:
				ok++
				ids = append(ids, a.id)
				if a.local {
					local++
				}
			case a.code == http.StatusServiceUnavailable && a.typ == "store_unavailable":
				unavailable++
			case a.code == http.StatusTooManyRequests:
			default:
				t.Fatalf("unexpected answer %+v", a)
			}
		}
		return ok, local, unavailable, unknown, ids
	}
	_, strictLocal, strictDown, strictUnknown, strictIDs := count(strictAnswers)
	_, lenientLocal, lenientDown, lenientUnknown, lenientIDs := count(lenientAnswers)
	unknown := map[string]int{"strict": strictUnknown, "lenient": lenientUnknown}
	if strictDown == 0 || strictLocal != 0 {
		t.Fatalf("strict (reject): %d answered 503, %d admitted locally", strictDown, strictLocal)
	}
	if lenientLocal == 0 || lenientDown != 0 {
		t.Fatalf("lenient (local): %d admitted locally, %d answered 503", lenientLocal, lenientDown)
	}
	// The replicas replay their spools once the store is back.
	waitFor(t, "the spools to be replayed", 30*time.Second, func() bool {
		return len(c.ledgerReserves("lenient")) >= len(lenientIDs)
	})
	for tenant, ids := range map[string][]string{"strict": strictIDs, "lenient": lenientIDs} {
		reserves := c.ledgerReserves(tenant)
		for _, id := range ids {
			if reserves[id] != 1 {
				t.Fatalf("%s: admission %s is in the ledger %d times", tenant, id, reserves[id])
			}
		}
		if extra := len(reserves) - len(ids); extra < 0 || extra > unknown[tenant] {
			t.Fatalf("%s: the ledger has %d reserves, clients were told of %d (and %d outcomes were unknown)",
				tenant, len(reserves), len(ids), unknown[tenant])
		}
	}
	c.audit()
	t.Logf("strict: %d admitted, %d refused while paused; lenient: %d admitted, %d of them locally",
		len(strictIDs), strictDown, len(lenientIDs), lenientLocal)
}

// TestReplicaKilledWithOpenReservations: a replica dies holding a tenant's
// every concurrency slot; the other replica's sweeper expires them at their
// TTL, and the tenant is admitted again.
func TestReplicaKilledWithOpenReservations(t *testing.T) {
	c := newCluster(t, 2, map[string]string{"TOKENGATE_SWEEP_INTERVAL": "500ms"})
	key := c.tenant("acme", rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 100 * rule.Micro, MaxConcurrent: 3, ReservationTTL: 2 * time.Second})
	for range 3 {
		if a := admit(c.replicas[0].url, key, "", 10); a.code != http.StatusCreated {
			t.Fatalf("%+v", a)
		}
	}
	docker(t, "kill", c.replicas[0].ctr.GetContainerID())
	if a := admit(c.replicas[1].url, key, "", 10); a.code != http.StatusTooManyRequests || a.limit != "concurrency" {
		t.Fatalf("slots should be held: %+v", a)
	}
	waitFor(t, "the slots to be freed by expiry", 15*time.Second, func() bool {
		return admit(c.replicas[1].url, key, "", 10).code == http.StatusCreated
	})
	var expired int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE kind = 'expire'`).Scan(&expired); err != nil || expired != 3 {
		t.Fatalf("%d expire entries (%v), want 3", expired, err)
	}
	c.audit()
}

// TestPostgresRestartedMidLoad restarts Postgres while clients admit with
// Idempotency-Keys and retry errors with the same key: every key ends with
// exactly one debit, whatever the errors on the way.
func TestPostgresRestartedMidLoad(t *testing.T) {
	c := newCluster(t, 2, map[string]string{"TOKENGATE_STORE_TIMEOUT": "2s"})
	key := c.tenant("acme", rule.Limits{TokensCapacity: 10_000_000, TokensRateMicro: 100_000 * rule.Micro})
	var mu sync.Mutex
	final := map[string]string{} // idempotency key -> admission id
	errorsSeen := map[string]int{}
	var wg sync.WaitGroup
	start := time.Now()
	for w := range 12 {
		wg.Go(func() {
			for i := 0; time.Since(start) < 10*time.Second; i++ {
				idem := fmt.Sprintf("w%d-%d", w, i)
				for attempt := 0; ; attempt++ {
					a := admit(c.replicas[(w+attempt)%2].url, key, idem, 10)
					if a.code == http.StatusCreated {
						mu.Lock()
						if prev, ok := final[idem]; ok && prev != a.id {
							t.Errorf("key %s admitted as %s and %s", idem, prev, a.id)
						}
						final[idem] = a.id
						mu.Unlock()
						break
					}
					mu.Lock()
					errorsSeen[fmt.Sprintf("%d %s", a.code, a.typ)]++
					mu.Unlock()
					if attempt > 100 {
						t.Errorf("key %s never admitted", idem)
						return
					}
					clientPause(200 * time.Millisecond)
				}
			}
		})
	}
	waitFor(t, "24 keys admitted before the restart", 60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(final) >= 24
	})
	docker(t, "restart", "--time", "1", c.pg.GetContainerID())
	wg.Wait()
	// The restart may have moved Postgres's host port: reconnect.
	dsn, err := c.pg.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c.pool, c.store = pool, account.NewStore(pool)
	reserves := c.ledgerReserves("acme")
	for idem, id := range final {
		if reserves[id] != 1 {
			t.Fatalf("key %s (admission %s) is in the ledger %d times", idem, id, reserves[id])
		}
	}
	if len(reserves) != len(final) {
		t.Fatalf("%d reserves in the ledger for %d keys: a double debit", len(reserves), len(final))
	}
	c.audit()
	t.Logf("%d keys admitted once each; errors met and retried: %v", len(final), errorsSeen)
}
