package account_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
)

// balanceMicro is a tenant's stored token balance.
func (b *testBundle) balanceMicro(t *testing.T, id string) int64 {
	t.Helper()
	var micro int64
	if err := b.pool.QueryRow(ctx, `SELECT tokens_micro FROM tenants WHERE id = $1`, id).Scan(&micro); err != nil {
		t.Fatal(err)
	}
	return micro
}

// TestOnlyTheFaceThatMadeAnAdmissionEndsIt: an admission the proxy made
// cannot be released nor settled through the API, whatever its state
// (open, or ended: another face learns nothing of how), and the refusal
// names it and its face and moves nothing; the proxy ends it.
func TestOnlyTheFaceThatMadeAnAdmissionEndsIt(t *testing.T) {
	t.Parallel()
	b, _ := setupFrozen(t)
	b.tenant(t, "acme", limits(1000, "1"))
	p := reserve(400)
	p.TenantID, p.Face = "acme", rule.FaceProxy
	r, err := b.store.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	refused := func(what string, err error) {
		t.Helper()
		var of *rule.OtherFaceError
		if !errors.As(err, &of) || !errors.Is(err, rule.ErrOtherFace) || of.AdmissionID != r.AdmissionID || of.Face != rule.FaceProxy {
			t.Fatalf("%s: %v; want an OtherFaceError naming %s and the proxy", what, err, r.AdmissionID)
		}
	}
	before := b.state(t, "acme")
	for _, f := range []rule.Face{"", rule.FaceAPI, rule.FaceRLS} {
		refused("release as "+string(f), fst(b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: r.AdmissionID, Face: f})))
		refused("settle as "+string(f), fst(b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 1, Face: f})))
	}
	if b.state(t, "acme") != before {
		t.Fatal("a refused end moved something")
	}
	st, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 100, OutputTokens: 150, Face: rule.FaceProxy})
	if err != nil || st.Admission.Face != rule.FaceProxy {
		t.Fatalf("the proxy's settle: %+v %v", st, err)
	}
	// Ended: the API still may not end it, nor learn how it ended.
	refused("release after the settle", fst(b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: r.AdmissionID})))
	refused("the same settle", fst(b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 100, OutputTokens: 150})))
	if got := b.balanceMicro(t, "acme"); got != 750*rule.Micro {
		t.Fatalf("balance %d, want 1000 - 250", got)
	}
	b.verify(t, "acme")
}

// TestIdempotencyKeysLiveInTheirFacesNamespace: the same key string through
// two faces makes two admissions, each face's retry finds its own, a
// settle by key finds only its face's admission, and a key with a space
// (which could spell another face's namespace) is refused.
func TestIdempotencyKeysLiveInTheirFacesNamespace(t *testing.T) {
	t.Parallel()
	b, _ := setupFrozen(t)
	b.tenant(t, "acme", limits(10_000, "1"))
	keyed := func(face rule.Face, cost int64, hash string) account.ReserveParams {
		p := reserve(cost)
		p.TenantID, p.Face, p.IdempotencyKey, p.RequestHash = "acme", face, "rls:req-1", []byte(hash)
		return p
	}
	apiR, err := b.store.Reserve(ctx, keyed(rule.FaceAPI, 10, "tenant's"))
	if err != nil {
		t.Fatal(err)
	}
	gwR, err := b.store.Reserve(ctx, keyed(rule.FaceRLS, 5000, "gateway's"))
	if err != nil || gwR.Replayed || gwR.AdmissionID == apiR.AdmissionID {
		t.Fatalf("the gateway's admission under the API's key: %+v %v", gwR, err)
	}
	for _, c := range []struct {
		face rule.Face
		hash string
		want string
	}{{rule.FaceAPI, "tenant's", apiR.AdmissionID}, {rule.FaceRLS, "gateway's", gwR.AdmissionID}} {
		again, err := b.store.Reserve(ctx, keyed(c.face, 10, c.hash))
		if err != nil || !again.Replayed || again.AdmissionID != c.want {
			t.Fatalf("retry through %s: %+v %v; want %s", c.face, again, err, c.want)
		}
	}
	// The gateway's stream end settles the gateway's admission.
	st, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", IdempotencyKey: "rls:req-1", InputTokens: 3000, Face: rule.FaceRLS})
	if err != nil || st.Admission.ID != gwR.AdmissionID {
		t.Fatalf("the gateway's settle by key: %+v %v", st, err)
	}
	if a, err := b.store.AdmissionGet(ctx, "acme", apiR.AdmissionID); err != nil || a.State != account.StateReserved {
		t.Fatalf("the API's admission: %+v %v", a, err)
	}
	for _, f := range []rule.Face{rule.FaceAPI, rule.FaceRLS} {
		p := keyed(f, 10, "x")
		p.IdempotencyKey = "rls req-1"
		var inv *rule.InvalidError
		if _, err := b.store.Reserve(ctx, p); !errors.As(err, &inv) || inv.Field != "Idempotency-Key" {
			t.Fatalf("a key with a space through %s: %v", f, err)
		}
	}
	if got := b.balanceMicro(t, "acme"); got != (10_000-10-3000)*rule.Micro {
		t.Fatalf("balance %d", got)
	}
	b.verify(t, "acme")
}

// TestOwnerWinsEveryRaceToEnd: on many admissions of the proxy at once,
// the proxy's settle races the API's release of the same admission, on
// two connections each. The proxy always wins, every API release is
// refused, and the balance is exactly the capacity less the real usage.
func TestOwnerWinsEveryRaceToEnd(t *testing.T) {
	t.Parallel()
	b, _ := setupFrozen(t)
	const n, capacity = 40, 1_000_000
	b.tenant(t, "acme", limits(capacity, "1"))
	ids := make([]string, n)
	for i := range ids {
		p := reserve(1000)
		p.TenantID, p.Face = "acme", rule.FaceProxy
		r, err := b.store.Reserve(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = r.AdmissionID
	}
	var used int64
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	start := make(chan struct{})
	for i, id := range ids {
		in, out := int64(10+i), int64(20+i)
		used += in + out
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			_, err := b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: id, Face: rule.FaceAPI})
			if !errors.Is(err, rule.ErrOtherFace) {
				errs <- fmt.Errorf("the API's release of %s: %v", id, err)
			}
		}()
		go func() {
			defer wg.Done()
			<-start
			if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: id, InputTokens: in, OutputTokens: out,
				Face: rule.FaceProxy}); err != nil {
				errs <- fmt.Errorf("the proxy's settle of %s: %v", id, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, id := range ids {
		if a, err := b.store.AdmissionGet(ctx, "acme", id); err != nil || a.State != account.StateSettled {
			t.Fatalf("admission %s: %+v %v", id, a, err)
		}
	}
	if got, want := b.balanceMicro(t, "acme"), (capacity-used)*rule.Micro; got != want {
		t.Fatalf("balance %d, want %d: the capacity less the %d used", got, want, used)
	}
	b.verify(t, "acme")
}

// TestReplayRefundAtTheFloor: local admissions replayed into a tenant near
// the debt floor are debited only down to it; each is refunded at most
// what it was debited (issue 36, item 4). On the code before the fix, the
// release refunded B's whole 60 and A's settle 60, leaving the tenant 90
// tokens above where its usage puts it.
func TestReplayRefundAtTheFloor(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	b.tenant(t, "acme", limits(100, "1")) // floor -100
	if _, err := b.store.Adjust(ctx, account.AdjustParams{TenantID: "acme", Tokens: -150, Reason: "to -50"}); err != nil {
		t.Fatal(err)
	}
	replay := func(cost int64) string {
		t.Helper()
		now := clock.Now()
		id := rule.NewLocalAdmissionID(now)
		if wrote, err := b.store.ReplayReserve(ctx, account.ReplayReserveParams{AdmissionID: id, TenantID: "acme",
			Estimate: reserve(cost).Estimate, CreatedAt: now, ExpiresAt: now.Add(time.Minute), Replica: "r1"}); err != nil || !wrote {
			t.Fatalf("replay: %v %v", wrote, err)
		}
		return id
	}
	a := replay(80)  // from -50: debited 50, to the floor
	bb := replay(60) // at the floor: debited nothing
	if got := b.balanceMicro(t, "acme"); got != -100*rule.Micro {
		t.Fatalf("balance %d after the replays, want the floor", got)
	}
	st, err := b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", AdmissionID: bb})
	if err != nil || st.DeltaMicro != 0 {
		t.Fatalf("release of the admission debited nothing: %+v %v; want a refund of 0", st, err)
	}
	st, err = b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: a, InputTokens: 10, OutputTokens: 10})
	if err != nil || st.DeltaMicro != 30*rule.Micro {
		t.Fatalf("settle at 20 of the admission debited 50: %+v %v; want a refund of 30", st, err)
	}
	if got := b.balanceMicro(t, "acme"); got != -70*rule.Micro {
		t.Fatalf("balance %d, want -70 tokens: -50 less the 20 used", got)
	}
	b.verify(t, "acme")
}
