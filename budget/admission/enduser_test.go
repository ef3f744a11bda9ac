package admission_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

// Two replicas (each its own pool, store and admitter) admit 8 end users
// of one tenant from 120 goroutines, by OpenAI's user field, with a cap of
// 5 end users: exactly 5 end users exist and are admitted, every other
// end user's request is refused ErrEndUserCap; no end user spends past its
// template's capacity nor the tenant past its own; every chain verifies.
func TestEndUsersConcurrentAcrossReplicas(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	cfg := func(c *pgxpool.Config) { c.MaxConns = 8 }
	pools := []*pgxpool.Pool{pgtest.Pool(t, url, cfg), pgtest.Pool(t, url, cfg)}
	stores := []*account.Store{account.NewStore(pools[0]), account.NewStore(pools[1])}
	rate := int64(1) // a micro-token a second: no refill to speak of
	if _, err := stores[0].CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 2000, TokensRateMicro: rate}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stores[0].EndUserPolicySet(ctx, account.EndUserPolicyParams{TenantID: "acme", Source: rule.SourceUser,
		Template: rule.Limits{TokensCapacity: 500, TokensRateMicro: rate}, MaxEndUsers: 5, IdleTTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	admitters := []*admission.Admitter{admission.New(admission.Config{Store: stores[0], Pool: pools[0]}),
		admission.New(admission.Config{Store: stores[1], Pool: pools[1]})}

	var mu sync.Mutex
	spent := map[string]int64{} // by end user's tenant id, as callers saw it
	capped := map[string]bool{} // end-user ids refused at the cap
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range 120 {
		wg.Go(func() {
			<-start
			for i := range 4 {
				user := fmt.Sprintf("user-%d", (g+i)%8)
				cost := int64(10 + (g*7+i*13)%30)
				req := request("acme", cost, 0)
				req.EndUser = admission.EndUser{Fields: estimator.EndUserFields{User: user}}
				r, _, err := admitters[g%2].Reserve(ctx, req)
				mu.Lock()
				switch {
				case err == nil:
					spent[r.Snapshot.TenantID] += cost
				case errors.Is(err, rule.ErrEndUserCap):
					capped[user] = true
				case errors.Is(err, rule.ErrRejected):
				default:
					t.Error(err)
				}
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	list, err := stores[0].EndUserList(ctx, "acme", "", 100)
	if err != nil || len(list) != 5 {
		t.Fatalf("%d end users (%v), want the cap, 5", len(list), err)
	}
	if len(capped) != 3 || len(spent) != 5 {
		t.Fatalf("%d end users refused at the cap, %d admitted; want 3 and 5", len(capped), len(spent))
	}
	var total int64
	for _, u := range list {
		id := u.Snapshot.TenantID
		if capped[u.EndUserID] {
			t.Fatalf("%s exists, yet some request of it was refused at the cap", u.EndUserID)
		}
		if spent[id] > 500 {
			t.Fatalf("end user %s admitted %d, its capacity is 500", u.EndUserID, spent[id])
		}
		tally, err := ledger.Verify(ctx, pools[0], id)
		if err != nil {
			t.Fatal(err)
		}
		if !exact(spent[id], 500, tally.BalanceMicro) {
			t.Fatalf("end user %s: its chain's balance %d, callers were admitted %d", u.EndUserID, tally.BalanceMicro, spent[id])
		}
		total += spent[id]
	}
	tally, err := ledger.Verify(ctx, pools[0], "acme")
	if err != nil {
		t.Fatal(err)
	}
	if total > 2000 || !exact(total, 2000, tally.BalanceMicro) {
		t.Fatalf("the tenant admitted %d (capacity 2000); its chain's balance %d", total, tally.BalanceMicro)
	}
	if total < 1900 {
		t.Fatalf("admitted only %d: the load did not reach the limits", total)
	}
}

// exact reports whether a level that started full at capacity and now
// holds balance (micro-tokens) spent exactly admitted tokens: the refill at
// one micro-token a second over the test is all that may differ.
func exact(admitted, capacity, balance int64) bool {
	refill := balance - (capacity-admitted)*rule.Micro
	return refill >= 0 && refill < 1000
}

// An end user that idled out after a replica resolved it: the replica's
// next request for it finds it expired in the decision, revives it (the
// cap applying) and decides again, keeping what it spent.
func TestExpiredEndUserIsRevivedByTheAdmitter(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	store := account.NewStore(pool).WithClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme", Limits: rule.Limits{TokensCapacity: 10_000, TokensRateMicro: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.EndUserPolicySet(ctx, account.EndUserPolicyParams{TenantID: "acme", Source: rule.SourceMetadataUserID,
		Template: rule.Limits{TokensCapacity: 100, TokensRateMicro: 1}, MaxEndUsers: 1, IdleTTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	a := admission.New(admission.Config{Store: store, Pool: pool})
	as := func(user string, cost int64) (*account.Reservation, error) {
		req := request("acme", cost, 0)
		req.EndUser = admission.EndUser{Fields: estimator.EndUserFields{MetadataUserID: user}}
		r, _, err := a.Reserve(ctx, req)
		return r, err
	}
	r, err := as("alice", 30)
	if err != nil {
		t.Fatal(err)
	}
	alice := r.Snapshot.TenantID
	if _, _, err := a.Release(ctx, admission.FaceAPI, account.ReleaseParams{TenantID: "acme", AdmissionID: r.AdmissionID}); err != nil {
		t.Fatal(err) // by the tenant's id: the admitter finds the end user's admission
	}
	if _, err := as("alice", 40); err != nil {
		t.Fatal(err)
	}
	advance(2 * time.Hour)
	if _, err := store.SweepOnce(ctx, nil); err != nil { // expires the reservation: a change
		t.Fatal(err)
	}
	advance(2 * time.Hour)
	if n, err := store.EndUserExpireIdle(ctx, 10); err != nil || n != 1 {
		t.Fatalf("expired %d, %v", n, err)
	}
	r, err = as("alice", 10)
	if err != nil || r.Snapshot.TenantID != alice || r.Snapshot.Tokens() != 100-40-10 {
		t.Fatalf("alice after expiry: %+v, %v", r, err)
	}
	// Expired again, and bob takes the only slot: alice is refused at the cap.
	advance(2 * time.Hour)
	if _, err := store.SweepOnce(ctx, nil); err != nil {
		t.Fatal(err)
	}
	advance(2 * time.Hour)
	if n, err := store.EndUserExpireIdle(ctx, 10); err != nil || n != 1 {
		t.Fatalf("expired %d, %v", n, err)
	}
	if _, err := as("bob", 5); err != nil {
		t.Fatal(err)
	}
	if _, err := as("alice", 5); !errors.Is(err, rule.ErrEndUserCap) {
		t.Fatalf("alice at the cap: %v", err)
	}
	tally, err := ledger.Verify(ctx, pool, alice)
	if err != nil || tally.BalanceMicro/rule.Micro != 50 {
		t.Fatalf("alice's chain: %+v %v", tally, err)
	}
}
