package lease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// The bounds, with 4 replicas (each its own pool, store, journal
// and holder) admitting one tenant's requests from many goroutines until
// each is refused:
//
//   - what is admitted never passes the budget, and the ledger records
//     exactly what was admitted;
//   - a holder refuses a request of cost c only when its own lease and the
//     balance together hold less than c: what it could not admit sat in the
//     other replicas' leases (at most their sum);
//   - what leases hold outstanding is at most, per replica, one slice plus
//     one request's cost;
//   - once every lease is returned, the balance is the budget less what
//     was admitted, to the micro-token, and the chain verifies.
func TestBoundFourReplicas(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const (
		budget   = 20000 // tokens
		slice    = 400   // tokens a take or renew asks for
		maxCost  = 40    // tokens
		replicas = 4
		workers  = 8 // goroutines per replica
	)
	b.tenant(t, "org", "", rule.Limits{TokensCapacity: budget * 2, TokensRateMicro: tok})
	b.tenant(t, "acme", "org", rule.Limits{TokensCapacity: budget, TokensRateMicro: tok})

	type result struct {
		admitted int64   // micro-tokens
		count    int64   // admissions
		refused  []int64 // costs refused, micro-tokens
	}
	holders := make([]*lease.Holder, replicas)
	results := make([]result, replicas)
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, replicas*workers)
	for r := range replicas {
		rep := b.replica(t, fmt.Sprintf("r%d", r+1), workers+2)
		holders[r] = lease.NewHolder(rep.leases, rep.journal, lease.HolderConfig{TenantID: "acme", SliceMicro: slice * tok, NowFunc: b.clock})
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(r), uint64(w)))
				for i := 0; ; i++ {
					cost := 1 + rng.Int64N(maxCost)
					err := holders[r].Admit(ctx, adm(fmt.Sprintf("r%d-w%d-%d", r, w, i), cost))
					mu.Lock()
					switch {
					case err == nil:
						results[r].admitted += cost * tok
						results[r].count++
					case errors.Is(err, lease.ErrExhausted):
						results[r].refused = append(results[r].refused, cost*tok)
					}
					mu.Unlock()
					if err != nil {
						if !errors.Is(err, lease.ErrExhausted) {
							errs <- err
						}
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("admit: %v", err)
	}

	var admitted, count int64
	for _, r := range results {
		admitted += r.admitted
		count += r.count
	}
	if admitted > budget*tok {
		t.Fatalf("admitted %d micro-tokens, above the budget %d", admitted, budget*tok)
	}
	// Every lease's unused amount, from the store, by holder.
	unused := make([]int64, replicas)
	rows, err := b.r.pool.Query(ctx, "SELECT holder, slice_micro - used_micro, used_micro FROM leases WHERE state = 'live'")
	if err != nil {
		t.Fatal(err)
	}
	var used int64
	for rows.Next() {
		var holder string
		var u, usedOf int64
		if err := rows.Scan(&holder, &u, &usedOf); err != nil {
			t.Fatal(err)
		}
		var r int
		if _, err := fmt.Sscanf(holder, "r%d", &r); err != nil || r < 1 || r > replicas {
			t.Fatalf("lease of holder %q", holder)
		}
		unused[r-1] += u
		used += usedOf
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	balance := b.balance(t, "acme")
	var outstanding int64
	for r := range replicas {
		outstanding += unused[r]
		if unused[r] > (slice+maxCost)*tok {
			t.Errorf("replica %d holds %d unused, above one slice and one request (%d)", r+1, unused[r], (slice+maxCost)*tok)
		}
	}
	if got := b.totalUsed(t); got != admitted {
		t.Fatalf("the journals hold %d micro-tokens, the holders answered %d admitted", got, admitted)
	}
	// Conservation, at this instant (the frozen clock: no refill): the
	// budget is the balance, the leases' unused amounts and what was
	// admitted (the live leases' used plus the returned ones').
	if balance+outstanding+admitted != budget*tok {
		t.Fatalf("balance %d + outstanding %d + admitted %d != budget %d", balance, outstanding, admitted, budget*tok)
	}
	for r, res := range results {
		if len(res.refused) == 0 {
			t.Fatalf("replica %d was never refused", r+1)
		}
		for _, c := range res.refused {
			// Both only fell since the refusal, so their sum now
			// bounds their sum then.
			if balance+unused[r] >= c {
				t.Errorf("replica %d refused %d while its lease (%d) and the balance (%d) held it", r+1, c, unused[r], balance)
			}
			// So what exact mode would still have admitted is within
			// the other replicas' leases.
			if budget*tok-admitted >= c+outstanding-unused[r] {
				t.Errorf("replica %d refused %d with %d left unadmitted, beyond the others' leases %d", r+1, c, budget*tok-admitted, outstanding-unused[r])
			}
		}
	}
	t.Logf("admitted %d of %d tokens in %d admissions; outstanding at the end %d; journaled %d", admitted/tok, budget, count, outstanding/tok, used/tok)

	for _, h := range holders {
		if err := h.Return(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"org", "acme"} {
		b.verify(t, id)
		n, delta, est := b.kindSum(t, id, ledger.KindReserve)
		if n != count || delta != 0 || est*tok != admitted {
			t.Errorf("%s: %d reserve entries moving %d for %d; want %d moving 0 for %d", id, n, delta, est*tok, count, admitted)
		}
		_, took, _ := b.kindSum(t, id, ledger.KindLeaseTake)
		_, gave, _ := b.kindSum(t, id, ledger.KindLeaseReturn)
		if took+gave != -admitted {
			t.Errorf("%s: leases took %d and gave back %d: net %d, want %d", id, took, gave, took+gave, -admitted)
		}
	}
	if got, want := b.balance(t, "acme"), budget*tok-admitted; got != want {
		t.Fatalf("acme balance %d after the returns, want %d", got, want)
	}
	if got, want := b.balance(t, "org"), 2*budget*tok-admitted; got != want {
		t.Fatalf("org balance %d after the returns, want %d", got, want)
	}
}

// totalUsed is the cost journaled against every lease: the estimates of
// the admissions made from one, booked or not.
func (b *testBundle) totalUsed(t *testing.T) int64 {
	t.Helper()
	var v int64
	if err := b.r.pool.QueryRow(context.Background(), `SELECT coalesce(sum(cost), 0) * 1000000 FROM admissions WHERE lease_id IS NOT NULL`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}
