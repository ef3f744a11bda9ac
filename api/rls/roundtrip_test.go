package rls_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/admission"
	"github.com/tokengate/tokengate/budget/credential"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/await"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// TestTheFaceAddsNoRoundTrip: requests reserved and settled at stream end
// through the rate limit service cost Postgres the round trips of the
// admission layer's own reserves and settles, and no more: the gateway's
// credential is checked in the decision's transaction (after its first
// use, from the guard's memory), and the stream-end call finds its
// reservation by request id inside the pipeline. Before, every call looked
// its gateway up with a query of its own and every stream-end call its
// reservation with another, and the face cost Postgres twice what the
// HTTP API does. (A refresh of the store's cached pool routes or alert
// rules, every 2 s, may land in either run: one each is allowed for.)
func TestTheFaceAddsNoRoundTrip(t *testing.T) {
	t.Parallel()
	rt := &pgtest.RoundTrips{}
	b := setupWith(t, rt.Trace)
	if r, err := b.call(t, b.gateway, 20, desc("tenant", "acme", "request_id", "warm")); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("warm-up: %v %v", r, err)
	}
	const n = 10
	before := rt.Count()
	for i := range n {
		id := fmt.Sprintf("face-%d", i)
		for _, d := range [][]string{{"tenant", "acme", "request_id", id}, {"tenant", "acme", "request_id", id, "phase", "response"}} {
			if r, err := b.call(t, b.gateway, 20, desc(d...)); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("%v: %v %v", d, r, err)
			}
		}
	}
	viaFace := rt.Count() - before

	before = rt.Count()
	for i := range n {
		p := account.ReserveParams{TenantID: "acme", Actor: "test", IdempotencyKey: fmt.Sprintf("rls:direct-%d", i),
			Estimate: estimator.Estimate{InputTokens: 20, Cost: 20, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}
		r, _, err := b.admitter.Reserve(ctx, admission.Request{ReserveParams: p, Face: admission.FaceRLS, Body: []byte{byte(i)}})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := b.admitter.Settle(ctx, admission.FaceRLS, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 20, Actor: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	direct := rt.Count() - before
	if viaFace > direct+2 {
		t.Fatalf("%d requests reserved and settled through the face took %d round trips to Postgres; through the admission layer alone, %d", n, viaFace, direct)
	}
	t.Logf("%d reserve+settle pairs: %d round trips through the face, %d through the admission layer", n, viaFace, direct)
}

// TestRevokedGatewayRefusedAtOnceWhileCached: a gateway verified once is
// answered from the guard's memory afterwards, and a revocation still
// applies at once, in every replica: the decision's own transaction finds
// it. 16 callers keep calling while the credential is revoked; every call
// that ends after the revocation commits is OVER_LIMIT with nothing
// debited (a call in flight at the revocation may have been decided just
// before it committed), and the store holds exactly the calls answered OK.
func TestRevokedGatewayRefusedAtOnceWhileCached(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gws, err := credential.GatewayList(ctx, b.pool)
	if err != nil || len(gws) != 1 {
		t.Fatalf("%v %v", gws, err)
	}
	if r, err := b.call(t, b.gateway, 1, desc("tenant", "acme")); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first call: %v %v", r, err)
	}
	var revokedAt atomic.Int64                              // unix nanos once the revocation committed
	var admittedBefore, admittedAfter, refused atomic.Int64 // after: started after the revocation committed
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				started := time.Now().UnixNano()
				r, err := b.call(t, b.gateway, 1, desc("tenant", "acme"))
				switch {
				case err != nil:
					t.Errorf("call: %v", err)
					return
				case r.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
					refused.Add(1)
				case revokedAt.Load() != 0 && started > revokedAt.Load():
					admittedAfter.Add(1)
				default:
					admittedBefore.Add(1)
				}
			}
		})
	}
	// Each phase lasts until 32 calls have ended in it (two per caller on
	// average), however slowly a stalled machine answers.
	until := func(what string, done func() bool) {
		if !await.For(10*time.Second, 0, done) {
			close(stop)
			wg.Wait()
			t.Fatalf("not 32 calls %s in 10 s", what)
		}
	}
	until("admitted before the revocation", func() bool { return admittedBefore.Load() >= 32 })
	if err := credential.GatewayRevoke(ctx, b.pool, gws[0].ID); err != nil {
		t.Fatal(err)
	}
	revokedAt.Store(time.Now().UnixNano())
	until("refused after the revocation", func() bool { return refused.Load() >= 32 })
	close(stop)
	wg.Wait()
	if admittedAfter.Load() != 0 {
		t.Fatalf("%d calls that began after the revocation committed were admitted", admittedAfter.Load())
	}
	if refused.Load() == 0 || admittedBefore.Load() == 0 {
		t.Fatalf("admitted %d before, refused %d: the run did not straddle the revocation", admittedBefore.Load(), refused.Load())
	}
	var admissions int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM admissions WHERE tenant_id = 'acme'`).Scan(&admissions); err != nil {
		t.Fatal(err)
	}
	if admissions != 1+admittedBefore.Load() {
		t.Fatalf("%d admissions in the store, %d answered OK", admissions, 1+admittedBefore.Load())
	}
	if got := testutil.ToFloat64(b.srv.Refused("unauthenticated")); got != float64(refused.Load()) {
		t.Fatalf("refused as unauthenticated: %v, want %d", got, refused.Load())
	}
}
