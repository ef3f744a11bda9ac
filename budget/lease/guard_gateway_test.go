package lease_test

import (
	"context"
	"errors"
	"fmt"
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
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 100000, TokensRateMicro: tok})
	doomed, _, err := credential.GatewayCreate(ctx, b.r.pool, "doomed", []string{"acme"})
	if err != nil {
		t.Fatal(err)
	}
	kept, _, err := credential.GatewayCreate(ctx, b.r.pool, "kept", []string{rule.GatewayAllTenants})
	if err != nil {
		t.Fatal(err)
	}
	b.revokeWhileJournaling(t, revoking{what: "gateway", doomed: doomed.ID, kept: kept.ID, refused: rule.ErrGatewayRevoked,
		with:   func(a *lease.Admission, id string) { a.GatewayID = id },
		revoke: func(ctx context.Context) error { return svc.GatewayRevoke(ctx, doomed.ID) }})
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
