package rls_test

import (
	"context"

	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tokengate/tokengate/api/rls"
	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/replica"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// The rate limit service's traffic (a gateway credential, and a key per
// request id) is admitted from a lease for a tenant in mode auto, and its
// stream-end call settles it by key exactly as exact mode does: a tenant
// in mode off given the same calls ends with the same balance, and the
// settle entries move the same amounts.
func TestLeasedRLSSettlesAsExact(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t, nil)
	store := account.NewStore(pool)
	rep, err := replica.New(replica.Config{DB: pool, Store: store, Registry: prometheus.NewRegistry(),
		AuthFailuresPerSecond: 1000, AuthFailureBurst: 1000,
		Leasing: replica.LeaseConfig{Holder: "rls", MinSlice: 400, Tick: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rep.Close)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { rep.Leases.Run(runCtx); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	b := &bundle{pool: pool, store: store, client: serve(t, rls.New(rep))}
	// One micro-token per second: the service decides on the real clock,
	// and the two tenants' balances are compared to the token.
	for _, id := range []string{"leased", "exact"} {
		if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: id, Limits: rule.Limits{TokensCapacity: 1000, TokensRateMicro: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rep.Admin.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: "leased", Mode: lease.ModeAuto}); err != nil {
		t.Fatal(err)
	}
	_, gw, err := credential.GatewayCreate(ctx, pool, "envoy-1", []string{"leased", "exact"})
	if err != nil {
		t.Fatal(err)
	}
	leasePaths := func() float64 { return testutil.ToFloat64(rep.Admitter.Paths(admission.FaceRLS, admission.PathLease)) }
	pair := func(tenant, id string, hits uint32, used uint64) {
		t.Helper()
		for range 2 { // the second is Envoy retrying the call
			r, err := b.call(t, gw, hits, desc("tenant", tenant, "model", "gpt-4o", "request_id", id))
			if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("%s %s request phase: %v %v", tenant, id, r, err)
			}
		}
		r, err := b.call(t, gw, 0, &ratelimitv3.RateLimitDescriptor{
			Entries: desc("tenant", tenant, "request_id", id, "phase", "response").Entries, HitsAddend: wrapperspb.UInt64(used)})
		if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%s %s response phase: %v %v", tenant, id, r, err)
		}
	}
	// The first call of the leased tenant is exact (no lease yet) and
	// wakes the top-up, run here.
	for _, tenant := range []string{"leased", "exact"} {
		pair(tenant, "warm", 10, 10)
	}
	rep.Leases.TopUpOnce(ctx)
	settlePath := func(path string) float64 {
		return testutil.ToFloat64(rep.Admitter.SettlePaths(admission.FaceRLS, path))
	}
	before, settledBefore, exactBefore := leasePaths(), settlePath(admission.PathLease), settlePath(admission.PathExact)
	for _, tenant := range []string{"leased", "exact"} {
		pair(tenant, "req-1", 300, 120)
		pair(tenant, "req-2", 50, 80) // usage above the estimate: charged
	}
	if got := leasePaths() - before; got != 2 {
		t.Fatalf("%v RLS admissions from a lease, want the leased tenant's two", got)
	}
	// Of the four settles, the metric names one in a lease's journal
	// (req-1 of the leased tenant), and three exact: req-2 past its
	// estimate, and the exact tenant's two.
	if l, e := settlePath(admission.PathLease)-settledBefore, settlePath(admission.PathExact)-exactBefore; l != 1 || e != 3 {
		t.Fatalf("settle paths: %v lease, %v exact; want 1 and 3", l, e)
	}
	// Mode off ends the lease (its unused part refunded, the journal's
	// refunds with it): the balances are exact mode's.
	if _, err := rep.Admin.TenantLeaseModeSet(ctx, lease.SetModeParams{TenantID: "leased", Mode: lease.ModeOff}); err != nil {
		t.Fatal(err)
	}
	if l, e := b.balance(t, "leased"), b.balance(t, "exact"); l != e || e != 1000-10-120-80 {
		t.Fatalf("balance leased %d, exact %d: want both %d", l, e, 1000-10-120-80)
	}
	// The same three settles, at the same actuals. req-1's, whose
	// admission the replica made from its lease, was settled in the
	// lease's journal: its entry moves nothing (the refund went back into
	// the lease, and to the tenant with the lease's return); req-2's,
	// past its estimate, and warm's, made exactly, were exact.
	settles := func(tenant string) (n int, actual int64, inJournal int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(actual), 0), count(*) FILTER (WHERE detail LIKE '{"lease":%')
			FROM ledger_entries WHERE tenant_id = $1 AND kind = 'settle'`, tenant).Scan(&n, &actual, &inJournal); err != nil {
			t.Fatal(err)
		}
		return n, actual, inJournal
	}
	ln, la, lj := settles("leased")
	en, ea, ej := settles("exact")
	if ln != en || la != ea || ln != 3 || lj != 1 || ej != 0 {
		t.Fatalf("settles leased %d at %d (%d in the journal), exact %d at %d (%d): want three at the same actuals, req-1's in the journal",
			ln, la, lj, en, ea, ej)
	}
	var admissions int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM admissions WHERE tenant_id = 'leased' AND state = 'settled'").Scan(&admissions); err != nil {
		t.Fatal(err)
	}
	if admissions != 3 {
		t.Fatalf("%d settled admissions of the leased tenant, want 3 (one per request id)", admissions)
	}
}
