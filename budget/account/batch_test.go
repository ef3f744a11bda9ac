package account_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/pgtest"
)

func keyed(tenant string, cost int64, key, hash string) account.Item {
	r := reserveFor(tenant, cost)
	r.IdempotencyKey, r.RequestHash = key, []byte(hash)
	return account.Item{TenantID: tenant, Op: account.Op{Reserve: &r}}
}

func item(tenant string, cost int64) account.Item {
	r := reserveFor(tenant, cost)
	return account.Item{TenantID: tenant, Op: account.Op{Reserve: &r}}
}

// TestDecideBatchIsolatesTenants: one transaction decides several tenants.
// One tenant's rejection, a missing tenant, an unknown admission and a
// tenant whose writes fail leave every other decision exact.
func TestDecideBatchIsolatesTenants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(100, "0.001"))
	b.tenant(t, "globex", limits(1000, "0.001"))
	b.tenant(t, "broken", limits(1000, "0.001"))
	// A bad row: the database refuses broken's admissions.
	if _, err := b.pool.Exec(ctx, `
		CREATE FUNCTION refuse_broken() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN RAISE EXCEPTION 'a row this tenant cannot take'; END $$;
		CREATE TRIGGER refuse_broken BEFORE INSERT ON admissions
		FOR EACH ROW WHEN (NEW.tenant_id = 'broken') EXECUTE FUNCTION refuse_broken();`); err != nil {
		t.Fatal(err)
	}
	res, err := b.store.DecideBatch(ctx, []account.Item{
		item("acme", 80),   // 0: fits
		item("globex", 10), // 1: fits
		item("broken", 10), // 2: its write fails
		item("acme", 50),   // 3: 20 left: refused
		item("nobody", 10), // 4: no such tenant
		{TenantID: "globex", Op: account.Op{Release: &account.ReleaseParams{TenantID: "globex", AdmissionID: "adm_unknown"}}}, // 5
		item("globex", 20), // 6: fits
	})
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case res[0].Err != nil || res[1].Err != nil || res[6].Err != nil:
		t.Fatalf("the fitting requests: %v %v %v", res[0].Err, res[1].Err, res[6].Err)
	case res[2].Err == nil || errors.Is(res[2].Err, rule.ErrRejected):
		t.Fatalf("broken's write: %+v", res[2])
	case !errors.Is(res[3].Err, rule.ErrRejected):
		t.Fatalf("acme's second: %v", res[3].Err)
	case !errors.Is(res[4].Err, rule.ErrTenantNotFound):
		t.Fatalf("no tenant: %v", res[4].Err)
	case !errors.Is(res[5].Err, rule.ErrAdmissionNotFound):
		t.Fatalf("unknown admission: %v", res[5].Err)
	}
	for id, want := range map[string]struct{ entries, balance int64 }{"acme": {2, 20}, "globex": {3, 970}, "broken": {1, 1000}} {
		tally := b.verify(t, id)
		if tally.Entries != want.entries || tally.BalanceMicro/rule.Micro != want.balance {
			t.Fatalf("%s: %d entries, balance %d; want %d and %d", id, tally.Entries, tally.BalanceMicro/rule.Micro, want.entries, want.balance)
		}
	}
}

// TestIdempotencyKeysRepeatedInOneBatch: a key repeated in one batch is one
// admission; the same key of another tenant is another; the key with
// another request is refused. Concurrently, through a pipeline, 40 callers
// sharing 4 keys make exactly 4 admissions.
func TestIdempotencyKeysRepeatedInOneBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(10_000, "1"))
	b.tenant(t, "globex", limits(10_000, "1"))
	res, err := b.store.DecideBatch(ctx, []account.Item{
		keyed("acme", 10, "k1", "h1"), keyed("acme", 10, "k1", "h1"), keyed("globex", 10, "k1", "h1"),
		keyed("acme", 10, "k1", "other"), keyed("acme", 10, "k2", "h2"),
	})
	if err != nil {
		t.Fatal(err)
	}
	r := func(i int) *account.Reservation {
		if res[i].Err != nil {
			t.Fatalf("item %d: %v", i, res[i].Err)
		}
		return res[i].Reservation
	}
	switch {
	case r(1).AdmissionID != r(0).AdmissionID || !r(1).Replayed || r(0).Replayed:
		t.Fatalf("the key twice: %+v %+v", r(0), r(1))
	case r(2).AdmissionID == r(0).AdmissionID || r(2).Replayed:
		t.Fatalf("another tenant's key: %+v", r(2))
	case !errors.Is(res[3].Err, rule.ErrIdempotencyMismatch):
		t.Fatalf("the key with another request: %v", res[3].Err)
	case r(4).AdmissionID == r(0).AdmissionID:
		t.Fatal("another key, the same admission")
	}

	pipe := account.NewPipeline(b.store, nil)
	ids := sync.Map{}
	var wg sync.WaitGroup
	for g := range 40 {
		wg.Go(func() {
			p := reserveFor("acme", 7)
			p.IdempotencyKey, p.RequestHash = fmt.Sprintf("c%d", g%4), []byte("same")
			r, err := pipe.Reserve(ctx, p)
			if err != nil {
				t.Error(err)
				return
			}
			if prev, loaded := ids.LoadOrStore(p.IdempotencyKey, r.AdmissionID); loaded && prev != r.AdmissionID {
				t.Errorf("key %s: admissions %s and %s", p.IdempotencyKey, prev, r.AdmissionID)
			}
		})
	}
	wg.Wait()
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM admissions WHERE tenant_id = 'acme' AND cost = 7`).Scan(&n); err != nil || n != 4 {
		t.Fatalf("%d admissions for 4 keys (%v)", n, err)
	}
	b.verify(t, "acme")
}

// TestFourReplicasOverlappingTenants: four replicas, each with its own
// pipelines, decide batches over overlapping sets of five tenants at once.
// Tenant rows are locked in id order, so no batch deadlocks (every request
// is decided), and each tenant's admissions are exactly its capacity plus
// the refill its ledger recorded, which is at most rate x elapsed.
func TestFourReplicasOverlappingTenants(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	var stores []*account.Store
	var pipes []*account.Pipeline
	for range 4 {
		s := account.NewStore(pgtest.Pool(t, url, func(c *pgxpool.Config) { c.MaxConns = 6 }))
		stores, pipes = append(stores, s), append(pipes, account.NewPipeline(s, &account.PipelineConfig{Shards: 2}))
	}
	b := &testBundle{pool: stores[0].Pool(), store: stores[0]}
	tenants := []string{"t1", "t2", "t3", "t4", "t5"}
	const capacity, rate = 2000, 100
	for _, id := range tenants {
		b.tenant(t, id, limits(capacity, fmt.Sprint(rate)))
	}
	var rejectedN atomic.Int64
	admitted := map[string]*atomic.Int64{}
	for _, id := range tenants {
		admitted[id] = &atomic.Int64{}
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range 200 {
		wg.Go(func() {
			<-start
			for i := range 6 {
				id := tenants[(g+i*3)%len(tenants)]
				cost := int64(5 + (g*7+i*13)%60)
				_, err := pipes[(g+i)%4].Reserve(ctx, reserveFor(id, cost))
				switch {
				case err == nil:
					admitted[id].Add(cost)
				case errors.Is(err, rule.ErrRejected):
					rejectedN.Add(1)
				default:
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
	for _, id := range tenants {
		sum := sums(t, b, id)
		tally := b.verify(t, id)
		if sum.admittedCost != admitted[id].Load() {
			t.Fatalf("%s: the ledger holds %d, callers were told %d", id, sum.admittedCost, admitted[id].Load())
		}
		if got, want := sum.admittedCost*rule.Micro, capacity*rule.Micro+sum.refill-tally.BalanceMicro; got != want {
			t.Fatalf("%s: admitted %d micro-tokens != capacity + refill - balance = %d", id, got, want)
		}
		if sum.refill > rate*sum.elapsedMicro || sum.minReserveBalance < 0 {
			t.Fatalf("%s: refill %d over %d us; min balance %d", id, sum.refill, sum.elapsedMicro, sum.minReserveBalance)
		}
	}
	if rejectedN.Load() == 0 {
		t.Fatal("demand never exceeded the buckets; the test proves nothing")
	}
}

// TestExpiryAndSettleOfOneAdmissionInOneBatch: a batch that expires a
// tenant's overdue reservations and settles one of them writes the
// admission once, as it ends up: settled late after the expiry, or settled
// (and not expired) when the settle comes first.
func TestExpiryAndSettleOfOneAdmissionInOneBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(1000, "1"))
	a1, a2 := b.mustReserve(t, "acme", 10), b.mustReserve(t, "acme", 10)
	if _, err := b.pool.Exec(ctx, `UPDATE admissions SET expires_at = clock_timestamp() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	settle := func(id string) account.Item {
		return account.Item{TenantID: "acme", Op: account.Op{Settle: &account.SettleParams{TenantID: "acme", AdmissionID: id, InputTokens: 1, OutputTokens: 1}}}
	}
	expire := account.Item{TenantID: "acme", Op: account.Op{Expire: &account.ExpireParams{TenantID: "acme"}}}
	res, err := b.store.DecideBatch(ctx, []account.Item{settle(a1.AdmissionID), expire, settle(a2.AdmissionID)})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Err != nil || res[2].Err != nil || res[1].Expired != 1 {
		t.Fatalf("%+v", res)
	}
	first, err := b.store.AdmissionGet(ctx, "acme", a1.AdmissionID)
	if err != nil || first.State != account.StateSettled || first.Late {
		t.Fatalf("settled before the expiry: %+v %v", first, err)
	}
	second, err := b.store.AdmissionGet(ctx, "acme", a2.AdmissionID)
	if err != nil || second.State != account.StateSettled || !second.Late {
		t.Fatalf("expired, then settled late: %+v %v", second, err)
	}
	if tally := b.verify(t, "acme"); tally.Entries != 1+2+3 {
		t.Fatalf("%d entries: want creation, 2 reserves, settle, expire, late settle", tally.Entries)
	}
	var open int64
	if err := b.pool.QueryRow(ctx, `SELECT open_reservations FROM tenants WHERE id = 'acme'`).Scan(&open); err != nil || open != 0 {
		t.Fatalf("%d slots open (%v)", open, err)
	}
}
