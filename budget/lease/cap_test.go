package lease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
)

// unused is what a tenant's live leases hold unused, in one statement (a
// snapshot).
func (b *testBundle) unused(t *testing.T, tenant string) int64 {
	t.Helper()
	var v int64
	if err := b.r.pool.QueryRow(context.Background(),
		"SELECT coalesce(sum(slice_micro - used_micro), 0) FROM leases WHERE tenant_id = $1 AND state = 'live'", tenant).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// With MaxUnusedPercent 50, a take or renew debits at most what keeps
// the tenant's live leases together under half its capacity unused,
// whatever it asks for, counting every other lease's unused part; what a
// lease's admissions use, or a return gives back, makes room again.
func TestUnusedCap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
	r1, r2 := b.replicaCapped(t, "r1", 4, 50), b.replicaCapped(t, "r2", 4, 50)
	a, err := r1.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 800 * tok, MinMicro: 1})
	if err != nil || a.SliceMicro != 500*tok {
		t.Fatalf("a take of 800 tokens with no other lease: %d, %v; want the cap, 500", a.SliceMicro, err)
	}
	if _, err := r2.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 100 * tok, MinMicro: 1}); !errors.Is(err, lease.ErrShort) {
		t.Fatalf("a take while another lease holds the cap: %v, want ErrShort", err)
	}
	for i := range 30 { // 300 tokens used from a: 200 unused
		if err := r1.journal.Append(ctx, a.ID, adm(fmt.Sprintf("a%d", i), 10)); err != nil {
			t.Fatal(err)
		}
	}
	c, err := r2.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 400 * tok, MinMicro: 1})
	if err != nil || c.SliceMicro != 300*tok {
		t.Fatalf("a take beside a lease with 200 unused: %d, %v; want 300", c.SliceMicro, err)
	}
	if got, err := r1.leases.Renew(ctx, a.ID, 400*tok); err != nil || got.SliceMicro != 500*tok {
		t.Fatalf("a renew at the cap: slice %d, %v; want 500, nothing added", got.SliceMicro, err)
	}
	if _, err := r2.leases.Return(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := r1.leases.Renew(ctx, a.ID, 400*tok); err != nil || got.SliceMicro != 800*tok {
		t.Fatalf("a renew with the other returned: slice %d, %v; want 800 (300 added, 500 unused)", got.SliceMicro, err)
	}
	if u := b.unused(t, "acme"); u != 500*tok {
		t.Fatalf("unused %d, want 500 tokens", u)
	}
	if _, err := r1.leases.Return(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if got := b.balance(t, "acme"); got != 700*tok {
		t.Fatalf("balance %d after the returns, want 700 tokens (300 admitted)", got)
	}
	b.verify(t, "acme")
}

// Four replicas take, renew, admit from and return leases of one tenant
// at once, each asking for more than its share; a sampler reads the sum
// the leases hold unused all along. It never passes half the capacity, and
// once every lease is returned the balance is the capacity less what was
// admitted, to the micro-token.
func TestUnusedCapFourReplicas(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const capacity = 10000 // tokens
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: capacity, TokensRateMicro: tok})
	var admitted atomic.Int64 // micro-tokens
	var stop atomic.Bool
	var ops [4]atomic.Int64 // each replica's operations done
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for r := range 4 {
		rep := b.replicaCapped(t, fmt.Sprintf("r%d", r+1), 6, 50)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			var cur lease.Lease
			for i := 0; !stop.Load() || cur.ID != ""; i++ {
				ops[r].Add(1)
				switch {
				case cur.ID == "" && stop.Load():
				case cur.ID == "":
					l, err := rep.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: int64(1500+rng.IntN(3000)) * tok, MinMicro: 1})
					switch {
					case errors.Is(err, lease.ErrShort):
					case err != nil:
						errs <- err
						return
					default:
						cur = l
					}
				case stop.Load() || rng.IntN(10) == 0:
					if _, err := rep.leases.Return(ctx, cur.ID); err != nil {
						errs <- err
						return
					}
					cur = lease.Lease{}
				case rng.IntN(4) == 0:
					l, err := rep.leases.Renew(ctx, cur.ID, int64(rng.IntN(3000))*tok)
					if err != nil {
						errs <- err
						return
					}
					cur.SliceMicro = l.SliceMicro
				default:
					cost := int64(1 + rng.IntN(60))
					switch err := rep.journal.Append(ctx, cur.ID, adm(fmt.Sprintf("r%d-%d", r, i), cost)); {
					case errors.Is(err, lease.ErrOver):
					case err != nil:
						errs <- err
						return
					default:
						admitted.Add(cost * tok)
					}
				}
			}
		}()
	}
	// The sampler reads until every replica has done its share of
	// operations, not for a number of samples: a replica's first
	// operations wait for its pool's connections, and a sampler that
	// counted its own reads could finish before they began.
	busy := func() bool {
		for r := range ops {
			if ops[r].Load() < 300 {
				return true
			}
		}
		return false
	}
	samples, peak := 0, int64(0)
	for (samples < 400 || busy()) && len(errs) == 0 { // a replica that failed stops; its error is reported below
		u := b.unused(t, "acme")
		if u > capacity/2*tok {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("the leases hold %d micro-tokens unused, past half the capacity", u)
		}
		peak = max(peak, u)
		samples++
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if peak < capacity/4*tok {
		t.Fatalf("the leases never held more than %d unused: the cap was never approached", peak)
	}
	if got, want := b.balance(t, "acme"), capacity*tok-admitted.Load(); got != want {
		t.Fatalf("balance %d after every return, want %d (capacity less %d admitted)", got, want, admitted.Load())
	}
	b.verify(t, "acme")
}
