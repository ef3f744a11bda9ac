package account_test

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/rule"
)

// gateway makes a gateway credential scoped to tenants and returns its id.
func (b *testBundle) gateway(t *testing.T, name string, tenants ...string) string {
	t.Helper()
	g, _, err := credential.GatewayCreate(ctx, b.pool, name, tenants)
	if err != nil {
		t.Fatal(err)
	}
	return g.ID
}

func viaGateway(tenantID, gatewayID string, cost int64) account.ReserveParams {
	p := reserveFor(tenantID, cost)
	p.GatewayID = gatewayID
	return p
}

// TestGatewayCheckedInTheDecision: a request's gateway is checked in the
// decision's own transaction: in scope, it is admitted; out of scope (an
// exact scope: a parent in it does not cover its child), or revoked, or
// unknown, it is refused and nothing moves. Out of scope is said before
// whether the tenant exists.
func TestGatewayCheckedInTheDecision(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.tenant(t, "acme", limits(1000, "1"))
	b.tenant(t, "globex", limits(1000, "1"))
	if _, err := b.store.CreateTenant(ctx, account.CreateTenantParams{ID: "acme-team", Parent: "acme", Limits: limits(500, "1")}); err != nil {
		t.Fatal(err)
	}
	edge := b.gateway(t, "edge", "acme")
	all := b.gateway(t, "all", credential.AllTenants)

	r, err := b.store.Reserve(ctx, viaGateway("acme", edge, 10))
	if err != nil {
		t.Fatalf("in scope: %v", err)
	}
	if _, err := b.store.Reserve(ctx, viaGateway("globex", all, 10)); err != nil {
		t.Fatalf("a gateway of every tenant: %v", err)
	}

	before := map[string]state{"acme": b.state(t, "acme"), "globex": b.state(t, "globex"), "acme-team": b.state(t, "acme-team")}
	for _, c := range []struct {
		tenant, gateway string
		want            error
	}{
		{"globex", edge, rule.ErrOutOfScope},
		{"acme-team", edge, rule.ErrOutOfScope}, // its parent's scope does not cover it
		{"nobody", edge, rule.ErrOutOfScope},    // not ErrTenantNotFound: the gateway learns nothing
		{"acme", "gw_unknown", rule.ErrGatewayRevoked},
	} {
		if _, err := b.store.Reserve(ctx, viaGateway(c.tenant, c.gateway, 10)); !errors.Is(err, c.want) {
			t.Fatalf("reserve for %s: %v, want %v", c.tenant, err, c.want)
		}
	}
	if err := fst(b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 5, GatewayID: "gw_unknown"})); !errors.Is(err, rule.ErrGatewayRevoked) {
		t.Fatalf("settle through an unknown gateway: %v", err)
	}

	if err := credential.GatewayRevoke(ctx, b.pool, edge); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Reserve(ctx, viaGateway("acme", edge, 10)); !errors.Is(err, rule.ErrGatewayRevoked) {
		t.Fatalf("reserve through a revoked gateway: %v", err)
	}
	if err := fst(b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: r.AdmissionID, GatewayID: edge})); !errors.Is(err, rule.ErrGatewayRevoked) {
		t.Fatalf("release through a revoked gateway: %v", err)
	}
	for id, s := range before {
		if after := b.state(t, id); after != s {
			t.Fatalf("%s changed though every request was refused:\n%+v\n%+v", id, s, after)
		}
	}
	// The same admission settles through a gateway that may.
	if err := fst(b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: r.AdmissionID, GatewayID: all})); err != nil {
		t.Fatalf("release through a live gateway: %v", err)
	}
}

// TestGatewayRevokedMidwayConcurrent: 200 callers over two replicas
// reserve and settle through one gateway while it is revoked. A call that
// began after the revocation committed is never admitted, and the ledger
// holds exactly the reserves and settles that were answered as done.
func TestGatewayRevokedMidwayConcurrent(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	b.tenant(t, "acme", limits(1_000_000, "1"))
	gw := b.gateway(t, "edge", "acme")

	var admitted, settled, refused, late atomic.Int64
	var revoked atomic.Bool
	revokeAt := make(chan struct{})
	var once atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-revokeAt
		if err := credential.GatewayRevoke(ctx, b.pool, gw); err != nil {
			t.Error(err)
		}
		revoked.Store(true)
	}()
	hammer(stores, func(g int, s *account.Store) {
		for range 3 {
			after := revoked.Load() // read before the call: the call began after the revocation committed
			r, err := s.Reserve(ctx, viaGateway("acme", gw, 10))
			switch {
			case errors.Is(err, rule.ErrGatewayRevoked):
				refused.Add(1)
				continue
			case err != nil:
				t.Error(err)
				return
			}
			if after {
				late.Add(1)
			}
			if admitted.Add(1) == 150 && once.CompareAndSwap(false, true) {
				close(revokeAt)
			}
			after = revoked.Load()
			_, err = s.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 5, OutputTokens: 5, GatewayID: gw})
			switch {
			case errors.Is(err, rule.ErrGatewayRevoked):
				refused.Add(1)
			case err != nil:
				t.Error(err)
				return
			default:
				settled.Add(1)
				if after {
					late.Add(1)
				}
			}
		}
	})
	if once.CompareAndSwap(false, true) {
		close(revokeAt)
	}
	<-done
	if late.Load() > 0 {
		t.Fatalf("%d calls that began after the revocation committed were done", late.Load())
	}
	var reserves, settles, admissions int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 'reserve'), count(*) FILTER (WHERE kind = 'settle')
		FROM ledger_entries WHERE tenant_id = 'acme'`).Scan(&reserves, &settles); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM admissions WHERE tenant_id = 'acme'`).Scan(&admissions); err != nil {
		t.Fatal(err)
	}
	if reserves != admitted.Load() || admissions != admitted.Load() || settles != settled.Load() {
		t.Fatalf("ledger: %d reserves, %d admissions, %d settles; callers were answered %d admitted, %d settled",
			reserves, admissions, settles, admitted.Load(), settled.Load())
	}
	if refused.Load() == 0 || admitted.Load() < 150 {
		t.Fatalf("%d admitted, %d refused: the revocation did not land midway", admitted.Load(), refused.Load())
	}
	b.verify(t, "acme")
	t.Logf("%d admitted, %d settled, %d refused after the revocation", admitted.Load(), settled.Load(), refused.Load())
}
