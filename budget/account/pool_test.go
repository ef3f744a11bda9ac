package account_test

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// A pool shared by three tenants over two replicas, on a frozen clock (no
// refill: exact): what the pool let through is exactly its capacity minus
// its balance, never more than its capacity; every reserve's entry
// records the pool never below zero; each tenant's served count and
// counter (served / weight) are exact; settles give back what was not used.
func TestPoolExactAcrossReplicas(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, s := range stores {
		s.WithClock(func() time.Time { return at })
	}
	b.store.WithClock(func() time.Time { return at })
	for _, id := range []string{"t1", "t2", "t3"} {
		b.tenant(t, id, limits(1_000_000_000, "1000"))
	}
	if err := b.store.CreatePool(ctx, "gpu", rule.PoolLimits{TokensCapacity: 8000, TokensRateMicro: 1}); err != nil {
		t.Fatal(err)
	}
	if err := b.store.RoutePool(ctx, "gpt-4o", "gpu"); err != nil {
		t.Fatal(err)
	}
	if err := b.store.SetPoolWeight(ctx, "gpu", "t3", 2); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	used := map[string]int64{}
	refused := 0
	hammer(stores, func(g int, s *account.Store) {
		tenant := []string{"t1", "t2", "t3"}[g%3]
		for i := range 5 {
			in, out := int64(10+(g*7+i*13)%50), int64(5+(g*11+i*3)%40)
			r, err := s.Reserve(ctx, inOut(tenant, in, out))
			var rej *rule.RejectedError
			if errors.As(err, &rej) {
				if rej.Limit != rule.LimitPool || rej.Pool != "gpu" || rej.PoolState == nil {
					t.Errorf("refused by %+v", rej)
				}
				mu.Lock()
				refused++
				mu.Unlock()
				continue
			}
			if err != nil {
				t.Error(err)
				return
			}
			if r.Pool == nil || r.Pool.ID != "gpu" || r.Pool.TokensMicro < 0 {
				t.Errorf("admitted with pool state %+v", r.Pool)
			}
			u := in + out
			if i%2 == 0 {
				u = in + out/4
				if _, err := s.Settle(ctx, account.SettleParams{TenantID: tenant, AdmissionID: r.AdmissionID, InputTokens: in, OutputTokens: out / 4}); err != nil {
					t.Error(err)
					return
				}
			}
			mu.Lock()
			used[tenant] += u
			mu.Unlock()
		}
	})
	if t.Failed() {
		return
	}
	pools, err := b.store.Pools(ctx)
	if err != nil || len(pools) != 1 {
		t.Fatal(pools, err)
	}
	p := pools[0]
	var total int64
	for _, u := range used {
		total += u
	}
	if total > 8000 || p.TokensMicro != (8000-total)*rule.Micro {
		t.Fatalf("the tenants used %d of the pool's 8000; it holds %d micro", total, p.TokensMicro)
	}
	if len(p.Shares) != 3 || len(p.Models) != 1 || p.Models[0] != "gpt-4o" {
		t.Fatalf("pool %+v", p)
	}
	// The counter is served / weight, plus what it was lifted by when the
	// tenant first came to a busy pool (never less: idle time earns nothing).
	for _, sh := range p.Shares {
		if sh.Served != used[sh.TenantID] || sh.VTCMicro < sh.Served*rule.Micro/sh.Weight || sh.Weight != map[string]int64{"t1": 1, "t2": 1, "t3": 2}[sh.TenantID] {
			t.Fatalf("share %+v, used %d", sh, used[sh.TenantID])
		}
	}
	if refused == 0 {
		t.Fatal("the pool never ran short: the test proves nothing")
	}
	// Every reserve's entry records the pool after it, never negative.
	rows, err := b.pool.Query(ctx, `SELECT detail FROM ledger_entries WHERE kind = 'reserve' AND detail LIKE '%"pool"%'`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var detail string
		var d struct {
			Pool      string `json:"pool"`
			PoolMicro int64  `json:"pool_micro"`
		}
		if err := rows.Scan(&detail); err != nil || json.Unmarshal([]byte(detail), &d) != nil || d.Pool != "gpu" || d.PoolMicro < 0 {
			t.Fatalf("entry detail %s (%v)", detail, err)
		}
		n++
	}
	for _, id := range []string{"t1", "t2", "t3"} {
		b.verify(t, id)
	}
	t.Logf("used %v of 8000 (%d reserves recorded), %d refused", used, n, refused)
}

func TestPoolAdministration(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	b.tenant(t, "acme", limits(1_000_000, "1000"))
	var le *rule.LimitError
	if err := b.store.CreatePool(ctx, "Bad Id", rule.PoolLimits{TokensCapacity: 1, TokensRateMicro: 1}); !errors.As(err, &le) {
		t.Fatalf("bad id: %v", err)
	}
	if err := b.store.CreatePool(ctx, "gpu", rule.PoolLimits{}); !errors.As(err, &le) || le.Field != "tokens_capacity" {
		t.Fatalf("no capacity: %v", err)
	}
	if err := b.store.CreatePool(ctx, "gpu", rule.PoolLimits{TokensCapacity: 100, TokensRateMicro: 10 * rule.Micro}); err != nil {
		t.Fatal(err)
	}
	if err := b.store.CreatePool(ctx, "gpu", rule.PoolLimits{TokensCapacity: 100, TokensRateMicro: 10 * rule.Micro}); !errors.Is(err, rule.ErrPoolExists) {
		t.Fatalf("twice: %v", err)
	}
	if err := b.store.RoutePool(ctx, "gpt-4o", "nope"); !errors.Is(err, rule.ErrPoolNotFound) {
		t.Fatalf("route to nothing: %v", err)
	}
	if err := b.store.SetPoolWeight(ctx, "gpu", "nobody", 2); !errors.Is(err, rule.ErrTenantNotFound) {
		t.Fatalf("weight of nobody: %v", err)
	}
	if err := b.store.RoutePool(ctx, "gpt-4o", "gpu"); err != nil {
		t.Fatal(err)
	}
	var tl *rule.TooLargeError
	if _, err := b.store.Reserve(ctx, inOut("acme", 60, 41)); !errors.As(err, &tl) || tl.Pool != "gpu" {
		t.Fatalf("larger than the pool: %v", err)
	}
	r := b.mustReserve(t, "acme", 80)
	_, err := b.reserve(t, "acme", 30)
	if rej := rejected(t, err, rule.LimitPool); rej.RetryAfter != time.Second || rej.Pool != "gpu" {
		t.Fatalf("retry after %s, want 1 s for 10 tokens at 10/s", rej.RetryAfter)
	}
	if _, err := b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: r.AdmissionID}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	// Lowering the capacity cuts the balance; the refill rate changes.
	if err := b.store.SetPoolLimits(ctx, "gpu", rule.PoolLimits{TokensCapacity: 50, TokensRateMicro: rule.Micro}); err != nil {
		t.Fatal(err)
	}
	pools, err := b.store.Pools(ctx)
	if err != nil || pools[0].TokensMicro != 50*rule.Micro || pools[0].Shares[0].Served != 0 {
		t.Fatalf("after release and cut: %+v %v", pools, err)
	}
	// Off the pool, the model is limited by the tenant only.
	if err := b.store.RoutePool(ctx, "gpt-4o", ""); err != nil {
		t.Fatal(err)
	}
	b.mustReserve(t, "acme", 500)
}
