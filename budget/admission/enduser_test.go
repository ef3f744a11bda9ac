package admission_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget"
	"github.com/tokengate/tokengate/budget/admission"
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
	stores := []*budget.Store{budget.NewStore(pools[0]), budget.NewStore(pools[1])}
	rate := int64(1) // a micro-token a second: no refill to speak of
	if _, err := stores[0].CreateTenant(ctx, budget.CreateTenantParams{ID: "acme", Limits: budget.Limits{TokensCapacity: 2000, TokensRateMicro: rate}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stores[0].EndUserPolicySet(ctx, budget.EndUserPolicyParams{TenantID: "acme", Source: budget.SourceUser,
		Template: budget.Limits{TokensCapacity: 500, TokensRateMicro: rate}, MaxEndUsers: 5, IdleTTL: time.Hour}); err != nil {
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
				case errors.Is(err, budget.ErrEndUserCap):
					capped[user] = true
				case errors.Is(err, budget.ErrRejected):
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
		if (500*budget.Micro-tally.BalanceMicro)/budget.Micro != spent[id] {
			t.Fatalf("end user %s: its chain's balance %d, callers were admitted %d", u.EndUserID, tally.BalanceMicro, spent[id])
		}
		total += spent[id]
	}
	tally, err := ledger.Verify(ctx, pools[0], "acme")
	if err != nil {
		t.Fatal(err)
	}
	if total > 2000 || (2000*budget.Micro-tally.BalanceMicro)/budget.Micro != total {
		t.Fatalf("the tenant admitted %d (capacity 2000); its chain's balance %d", total, tally.BalanceMicro)
	}
	if total < 1900 {
		t.Fatalf("admitted only %d: the load did not reach the limits", total)
	}
}
