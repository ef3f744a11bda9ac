package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
)

// The journal applies a gateway's rules as a decision does: a revoked or
// unknown gateway refuses with rule.ErrGatewayRevoked, one scoped to other
// tenants with rule.ErrOutOfScope; a gateway of every tenant or of the
// lease's admits. A refusal is its admission's alone.
func TestJournalGatewayRules(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 10000, TokensRateMicro: tok})
	all, _, err := credential.GatewayCreate(ctx, b.r.pool, "all", []string{rule.GatewayAllTenants})
	if err != nil {
		t.Fatal(err)
	}
	own, _, err := credential.GatewayCreate(ctx, b.r.pool, "own", []string{"acme"})
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := credential.GatewayCreate(ctx, b.r.pool, "other", []string{"beta"})
	if err != nil {
		t.Fatal(err)
	}
	l, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 1000 * tok})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		gw   string
		want error
	}{{all.ID, nil}, {own.ID, nil}, {other.ID, rule.ErrOutOfScope}, {"gw_unknown", rule.ErrGatewayRevoked}} {
		a := adm(fmt.Sprintf("g-%d", i), 1)
		a.GatewayID = c.gw
		if err := b.r.journal.Append(ctx, l.ID, a); !errors.Is(err, c.want) || (c.want == nil && err != nil) {
			t.Fatalf("gateway %s: %v, want %v", c.gw, err, c.want)
		}
	}
	if _, _, used, _ := b.leaseState(t, l.ID); used != 2*tok {
		t.Fatalf("used %d, want the 2 admitted", used)
	}
}

// Eight goroutines on two replicas journal admissions through two
// gateways while one is revoked: nothing is journaled through the revoked
// gateway after its revoke commits (the revoke locks the live leases of
// its tenants), and the other gateway's admissions go on.
func TestGatewayRevokeWhileJournaling(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	svc := b.adminOf(t)
	other := b.replica(t, "r1", 4)
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 100000, TokensRateMicro: tok})
	doomed, _, err := credential.GatewayCreate(ctx, b.r.pool, "doomed", []string{"acme"})
	if err != nil {
		t.Fatal(err)
	}
	kept, _, err := credential.GatewayCreate(ctx, b.r.pool, "kept", []string{rule.GatewayAllTenants})
	if err != nil {
		t.Fatal(err)
	}
	l, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 50000 * tok})
	if err != nil {
		t.Fatal(err)
	}
	var made [2]atomic.Int64 // answered as made: doomed's, kept's
	var revoked atomic.Bool
	var keptAfter atomic.Int64
	started, enough := make(chan struct{}), make(chan struct{})
	var startOnce, enoughOnce sync.Once
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j := b.r.journal
			if w%2 == 1 {
				j = other.journal
			}
			k, gw := 0, doomed.ID // workers 0-3 the doomed gateway, 4-7 the kept one
			if w >= 4 {
				k, gw = 1, kept.ID
			}
			for i := 0; ; i++ {
				if i == 20 {
					startOnce.Do(func() { close(started) })
				}
				after := revoked.Load()
				a := adm(fmt.Sprintf("%d-%d-%d", k, w, i), 1)
				a.GatewayID = gw
				err := j.Append(ctx, l.ID, a)
				switch {
				case k == 0 && errors.Is(err, rule.ErrGatewayRevoked):
					return
				case err != nil:
					t.Errorf("worker %d: %v", w, err)
					return
				case k == 0 && after:
					t.Errorf("worker %d: an admission through the revoked gateway made after the revoke returned", w)
					return
				}
				made[k].Add(1)
				if k == 1 && after && keptAfter.Add(1) == 40 {
					enoughOnce.Do(func() { close(enough) })
				}
				select {
				case <-enough:
					return
				default:
				}
			}
		}()
	}
	<-started
	if err := svc.GatewayRevoke(ctx, doomed.ID); err != nil {
		t.Fatal(err)
	}
	revoked.Store(true)
	var atRevoke int64
	if err := b.r.pool.QueryRow(ctx, "SELECT count(*) FROM lease_admissions WHERE lease_id = $1 AND admission_id LIKE '0-%'", l.ID).Scan(&atRevoke); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	var doomedRows, keptRows int64
	if err := b.r.pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE admission_id LIKE '0-%'), count(*) FILTER (WHERE admission_id LIKE '1-%') FROM lease_admissions WHERE lease_id = $1", l.ID).Scan(&doomedRows, &keptRows); err != nil {
		t.Fatal(err)
	}
	if doomedRows != atRevoke || doomedRows != made[0].Load() {
		t.Fatalf("revoked gateway: %d journaled at the revoke, %d at the end, %d answered as made", atRevoke, doomedRows, made[0].Load())
	}
	if keptRows != made[1].Load() || keptAfter.Load() < 40 {
		t.Fatalf("kept gateway: %d journaled, %d answered as made, %d after the revoke", keptRows, made[1].Load(), keptAfter.Load())
	}
	if _, _, used, _ := b.leaseState(t, l.ID); used != (doomedRows+keptRows)*tok {
		t.Fatalf("used %d, want the %d journaled", used, doomedRows+keptRows)
	}
	if _, err := b.r.leases.Return(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	b.verify(t, "acme")
}

// A gateway's revoke waits for a journal group in flight on a lease it may
// admit through (a transaction holding the lease row, as a group does):
// a gateway of the lease's tenant, and a gateway of every tenant, whose
// revoke locks every live lease. Every group after it reads the gateway
// revoked.
func TestGatewayRevokeWaitsForGroupInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	svc := b.adminOf(t)
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
	l, err := b.r.leases.Take(ctx, lease.TakeParams{TenantID: "acme", WantMicro: 100 * tok})
	if err != nil {
		t.Fatal(err)
	}
	for i, scope := range [][]string{{"acme"}, {rule.GatewayAllTenants}} {
		g, _, err := credential.GatewayCreate(ctx, b.r.pool, fmt.Sprintf("gw%d", i), scope)
		if err != nil {
			t.Fatal(err)
		}
		group, err := b.r.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := group.Exec(ctx, "SELECT 1 FROM leases WHERE id = $1 FOR UPDATE", l.ID); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- svc.GatewayRevoke(ctx, g.ID) }()
		// The signal: the revoke's backend waits on a lock.
		for waiting := 0; waiting == 0; {
			select {
			case err := <-done:
				_ = group.Rollback(ctx)
				t.Fatalf("scope %v: the revoke committed (%v) with a journal group of the lease in flight", scope, err)
			default:
			}
			if err := b.r.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'").Scan(&waiting); err != nil {
				t.Fatal(err)
			}
		}
		if err := group.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		a := adm(fmt.Sprintf("late-%d", i), 1)
		a.GatewayID = g.ID
		if err := b.r.journal.Append(ctx, l.ID, a); !errors.Is(err, rule.ErrGatewayRevoked) {
			t.Fatalf("scope %v: append through the revoked gateway: %v, want rule.ErrGatewayRevoked", scope, err)
		}
	}
}
