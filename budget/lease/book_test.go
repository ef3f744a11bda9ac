package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

// estimate is an estimate of cost tokens, half input, half output.
func estimate(cost int64) estimator.Estimate {
	return estimator.Estimate{Model: "gpt-4o", InputTokens: cost / 2, OutputTokens: cost - cost/2, Cost: cost,
		InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}
}

// admissionOf is the lease admission the admission use case makes of p,
// as it would reserve it in exact mode.
func admissionOf(id string, p account.ReserveParams) lease.Admission {
	return lease.Admission{Admission: account.Admission{ID: id, TenantID: p.TenantID, Estimate: p.Estimate, Family: account.ModelKey(p.Estimate), Face: p.Face},
		CostMicro: p.Estimate.Cost * tok, Actor: p.Actor, KeyID: p.KeyID, IdempotencyKey: p.IdempotencyKey, RequestHash: p.RequestHash}
}

// levelDeltas are the sums of a tenant's entries' deltas by kind.
func (b *testBundle) levelDeltas(t *testing.T, id string) map[ledger.Kind]int64 {
	t.Helper()
	out := map[ledger.Kind]int64{}
	for _, k := range []ledger.Kind{ledger.KindSettle, ledger.KindRelease, ledger.KindExpire} {
		_, d, _ := b.kindSum(t, id, k)
		out[k] = d
	}
	return out
}

// A lease admission is settled, released, and settled by key (the rate
// limit service's "rls:<request id>") while it is still only in the
// journal: the settle books its lease in its own transaction, and refunds
// or charges exactly what exact mode does. The same usage on an exact tree
// and on a leased one leaves the same balances and the same settle and
// release deltas at every level, and every chain verifies.
func TestLeaseSettleAsExact(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, root := range []string{"xorg", "lorg"} {
		b.tenant(t, root, "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
	}
	b.tenant(t, "x", "xorg", rule.Limits{TokensCapacity: 500, TokensRateMicro: tok})
	b.tenant(t, "l", "lorg", rule.Limits{TokensCapacity: 500, TokensRateMicro: tok})
	h := lease.NewHolder(b.r.leases, b.r.journal, lease.HolderConfig{TenantID: "l", SliceMicro: 400 * tok, NowFunc: b.clock})

	type step struct {
		cost     int64
		key      string
		face     rule.Face
		settle   *[2]int64 // usage in, out; nil: release
		byKey    bool
		wantMore bool // the usage exceeds the estimate
	}
	steps := []step{
		{cost: 100, settle: &[2]int64{20, 30}},
		{cost: 60, key: "rls:req-1", face: rule.FaceRLS, settle: &[2]int64{60, 30}, byKey: true, wantMore: true},
		{cost: 80},
		{cost: 40, key: "k-4", settle: &[2]int64{10, 10}, byKey: true},
	}
	for i, st := range steps {
		var deltas [2]int64
		for j, tenant := range []string{"x", "l"} {
			p := account.ReserveParams{TenantID: tenant, Estimate: estimate(st.cost), IdempotencyKey: st.key, RequestHash: []byte(st.key), ReplayNow: true, Face: st.face}
			var id string
			if tenant == "x" {
				r, err := b.r.acct.Reserve(ctx, p)
				if err != nil {
					t.Fatal(err)
				}
				id = r.AdmissionID
			} else {
				id = rule.NewStoreAdmissionID(b.clock())
				if err := h.Admit(ctx, admissionOf(id, p)); err != nil {
					t.Fatal(err)
				}
			}
			named := id
			if st.byKey {
				named = ""
			}
			var s *account.Settlement
			var err error
			if st.settle != nil {
				s, err = b.r.acct.Settle(ctx, account.SettleParams{TenantID: tenant, AdmissionID: named, IdempotencyKey: map[bool]string{true: st.key}[st.byKey],
					InputTokens: st.settle[0], OutputTokens: st.settle[1], Face: st.face})
			} else {
				s, err = b.r.acct.Release(ctx, account.ReleaseParams{TenantID: tenant, AdmissionID: named, Face: st.face})
			}
			if err != nil {
				t.Fatalf("step %d, %s: %v", i, tenant, err)
			}
			if s.Admission.ID != id {
				t.Fatalf("step %d, %s: ended %s, not %s", i, tenant, s.Admission.ID, id)
			}
			deltas[j] = s.DeltaMicro
		}
		if deltas[0] != deltas[1] || (st.wantMore != (deltas[0] < 0)) {
			t.Fatalf("step %d: exact moved %d, lease %d", i, deltas[0], deltas[1])
		}
	}
	if err := h.Return(ctx); err != nil {
		t.Fatal(err)
	}
	for _, pair := range [][2]string{{"x", "l"}, {"xorg", "lorg"}} {
		if bx, bl := b.balance(t, pair[0]), b.balance(t, pair[1]); bx != bl {
			t.Fatalf("%s holds %d, %s %d", pair[0], bx, pair[1], bl)
		}
		dx, dl := b.levelDeltas(t, pair[0]), b.levelDeltas(t, pair[1])
		for k, v := range dx {
			if dl[k] != v {
				t.Fatalf("%s: %s deltas %d, %s's %d", k, pair[1], dl[k], pair[0], v)
			}
		}
		b.verify(t, pair[0])
		b.verify(t, pair[1])
	}
	var open, unbooked int
	if err := b.r.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM admissions WHERE tenant_id = 'l' AND state = 'reserved'),
		(`+unbookedSQL+`)`).Scan(&open, &unbooked); err != nil {
		t.Fatal(err)
	}
	if open != 0 || unbooked != 0 {
		t.Fatalf("%d lease admissions still reserved, %d unbooked", open, unbooked)
	}
}

// Many goroutines on two replicas send the same Idempotency-Keys, through
// the lease path and the exact path mixed: each key is admitted exactly
// once, every other request is answered as its replay (same admission),
// and the balance is debited once per key.
func TestLeaseKeysAdmittedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 100000, TokensRateMicro: tok})
	r1 := b.replica(t, "r1", 4)
	replicas := []*replica{b.r, r1}
	holders := []*lease.Holder{
		lease.NewHolder(b.r.leases, b.r.journal, lease.HolderConfig{TenantID: "acme", SliceMicro: 500 * tok, NowFunc: b.clock}),
		lease.NewHolder(r1.leases, r1.journal, lease.HolderConfig{TenantID: "acme", SliceMicro: 500 * tok, NowFunc: b.clock}),
	}
	const keys, tries, cost = 12, 8, 10
	var mu sync.Mutex
	admitted := map[string][]string{} // key -> admission ids admitted (not replays)
	replayed := map[string][]string{}
	var wg sync.WaitGroup
	for k := range keys {
		for i := range tries {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("key-%d", k)
				p := account.ReserveParams{TenantID: "acme", Estimate: estimate(cost), IdempotencyKey: key, RequestHash: []byte(key), ReplayNow: true}
				var id string
				replay := false
				if i%2 == 0 {
					r, err := replicas[i%4/2].acct.Reserve(ctx, p)
					if err != nil {
						t.Error(err)
						return
					}
					id, replay = r.AdmissionID, r.Replayed
				} else {
					id = rule.NewStoreAdmissionID(b.clock())
					var re *lease.ReplayError
					switch err := holders[i%4/2].Admit(ctx, admissionOf(id, p)); {
					case errors.As(err, &re):
						id, replay = re.AdmissionID, true
					case err != nil:
						t.Error(err)
						return
					}
				}
				mu.Lock()
				defer mu.Unlock()
				if replay {
					replayed[key] = append(replayed[key], id)
				} else {
					admitted[key] = append(admitted[key], id)
				}
			}()
		}
	}
	wg.Wait()
	for k := range keys {
		key := fmt.Sprintf("key-%d", k)
		if len(admitted[key]) != 1 || len(replayed[key]) != tries-1 {
			t.Fatalf("%s: admitted %v, replayed %d times", key, admitted[key], len(replayed[key]))
		}
		for _, id := range replayed[key] {
			if id != admitted[key][0] {
				t.Fatalf("%s: replayed %s, admitted %s", key, id, admitted[key][0])
			}
		}
	}
	// Another request with a key in use is refused, whichever path.
	p := account.ReserveParams{TenantID: "acme", Estimate: estimate(cost), IdempotencyKey: "key-0", RequestHash: []byte("other"), ReplayNow: true}
	if err := holders[0].Admit(ctx, admissionOf(rule.NewStoreAdmissionID(b.clock()), p)); !errors.Is(err, rule.ErrIdempotencyMismatch) {
		t.Fatalf("a reused key with another request: %v", err)
	}
	for _, h := range holders {
		if err := h.Return(ctx); err != nil {
			t.Fatal(err)
		}
	}
	b.keyedOnce(t, "acme", keys, 100000, cost)
}

// keyedOnce checks, once every lease of the tenant (a root) is ended, that
// keys keyed requests of cost tokens each were admitted once each: one
// admissions row, key row and reserve entry per key, the balance (from
// capacity, on a frozen clock) debited once per key, the chain whole.
func (b *testBundle) keyedOnce(t *testing.T, tenant string, keys int, capacity, cost int64) {
	t.Helper()
	var nAdm, nKeys, nReserve int
	if err := b.r.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM admissions WHERE tenant_id = $1),
		(SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1),
		(SELECT count(*) FROM ledger_entries WHERE tenant_id = $1 AND kind = 'reserve')`, tenant).Scan(&nAdm, &nKeys, &nReserve); err != nil {
		t.Fatal(err)
	}
	if nAdm != keys || nKeys != keys || nReserve != keys {
		t.Fatalf("%d admissions, %d keys, %d reserve entries; want %d each", nAdm, nKeys, nReserve, keys)
	}
	if got, want := b.balance(t, tenant), (capacity-int64(keys)*cost)*tok; got != want {
		t.Fatalf("balance %d, want %d", got, want)
	}
	b.verify(t, tenant)
}

// A lease admission never settled is booked by the lease's sweep, then
// expired by the account's expiry like any reservation, once: it stays
// charged at its estimate (what exact mode's expiry does), and its lease's
// unused part was refunded once, at the sweep.
func TestLeaseAdmissionExpires(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "org", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
	b.tenant(t, "acme", "org", rule.Limits{TokensCapacity: 500, TokensRateMicro: tok, ReservationTTL: time.Minute})
	h := lease.NewHolder(b.r.leases, b.r.journal, lease.HolderConfig{TenantID: "acme", SliceMicro: 300 * tok, NowFunc: b.clock})
	id := rule.NewStoreAdmissionID(b.clock())
	if err := h.Admit(ctx, admissionOf(id, account.ReserveParams{TenantID: "acme", Estimate: estimate(100)})); err != nil {
		t.Fatal(err)
	}
	b.advance(11 * time.Second) // the lease's TTL: its holder is gone
	if n, err := b.r.leases.Sweep(ctx, 10); err != nil || n != 1 {
		t.Fatalf("sweep: %d, %v", n, err)
	}
	if n, err := b.r.acct.Expire(ctx, "acme"); err != nil || n != 0 {
		t.Fatalf("expire before its time: %d, %v", n, err)
	}
	b.advance(time.Minute)
	for i, want := range []int{1, 0} {
		if n, err := b.r.acct.Expire(ctx, "acme"); err != nil || n != want {
			t.Fatalf("expire %d: %d, %v; want %d", i, n, err, want)
		}
	}
	for _, lv := range []string{"acme", "org"} {
		if n, _, _ := b.kindSum(t, lv, ledger.KindExpire); n != 1 {
			t.Fatalf("%s: %d expire entries", lv, n)
		}
		if n, d, _ := b.kindSum(t, lv, ledger.KindLeaseReturn); n != 1 || d != 200*tok {
			t.Fatalf("%s: %d returns of %d", lv, n, d)
		}
		b.verify(t, lv)
	}
	// 500 - 100 charged, and 71 s of refill at a token a second.
	if got := b.balance(t, "acme"); got != 471*tok {
		t.Fatalf("acme holds %d, want 471 tokens", got)
	}
	var state string
	if err := b.r.pool.QueryRow(ctx, "SELECT state FROM admissions WHERE id = $1", id).Scan(&state); err != nil || state != "expired" {
		t.Fatalf("admission %s: %q, %v", id, state, err)
	}
}

// Eight goroutines on one replica (eight connections) admit from a
// small lease (so it renews all along) and settle each admission at once,
// mostly before any renew books it: every settle books the lease in its
// own transaction, each admission is settled exactly once, and the
// balance ends at the capacity less the usage, to the micro-token.
func TestLeaseSettleWhileJournaling(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const capacity, workers, each, cost, used = 100000, 8, 10, 20, 7
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: capacity, TokensRateMicro: tok})
	h := lease.NewHolder(b.r.leases, b.r.journal, lease.HolderConfig{TenantID: "acme", SliceMicro: 50 * tok, NowFunc: b.clock})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id := fmt.Sprintf("adm-%d-%d", w, i)
				if err := h.Admit(ctx, admissionOf(id, account.ReserveParams{TenantID: "acme", Estimate: estimate(cost)})); err != nil {
					t.Error(err)
					return
				}
				s, err := b.r.acct.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: id, InputTokens: used - 3, OutputTokens: 3})
				if err != nil || s.Replayed {
					t.Errorf("settle %s: %+v, %v", id, s, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := h.Return(ctx); err != nil {
		t.Fatal(err)
	}
	var settled, unbooked int
	if err := b.r.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM admissions WHERE state = 'settled'),
		(`+unbookedSQL+`)`).Scan(&settled, &unbooked); err != nil {
		t.Fatal(err)
	}
	if settled != workers*each || unbooked != 0 {
		t.Fatalf("%d settled, %d unbooked", settled, unbooked)
	}
	if n, _, _ := b.kindSum(t, "acme", ledger.KindSettle); n != workers*each {
		t.Fatalf("%d settle entries", n)
	}
	if got, want := b.balance(t, "acme"), int64(capacity-workers*each*used)*tok; got != want {
		t.Fatalf("balance %d, want %d", got, want)
	}
	b.verify(t, "acme")
}

// A settle books its lease only up to the admission it ends: the ones
// journaled before it get their reserve entries in the settle's
// transaction (an end's entry follows its reserve's), the ones after it
// are left to the lease's next booking, which LeasePending reports and
// Book writes; every chain verifies.
func TestSettleBooksUpToItsAdmission(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.tenant(t, "acme", "", rule.Limits{TokensCapacity: 1000, TokensRateMicro: tok})
	h := lease.NewHolder(b.r.leases, b.r.journal, lease.HolderConfig{TenantID: "acme", SliceMicro: 500 * tok, NowFunc: b.clock})
	ids := []string{"adm-1", "adm-2", "adm-3"}
	for _, id := range ids {
		if err := h.Admit(ctx, admissionOf(id, account.ReserveParams{TenantID: "acme", Estimate: estimate(50)})); err != nil {
			t.Fatal(err)
		}
	}
	booked := func() []string {
		t.Helper()
		rows, err := b.r.pool.Query(ctx, `SELECT admission_id FROM ledger_entries WHERE tenant_id = 'acme' AND kind = 'reserve' ORDER BY seq`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if _, err := b.r.acct.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: "adm-2", InputTokens: 10, OutputTokens: 10}); err != nil {
		t.Fatal(err)
	}
	if got := booked(); !slices.Equal(got, ids[:2]) {
		t.Fatalf("after settling adm-2, reserve entries of %v, want %v", got, ids[:2])
	}
	leaseID := h.LeaseID()
	if pending, err := b.r.acct.LeasePending(ctx, leaseID); err != nil || !pending {
		t.Fatalf("adm-3 is not booked, LeasePending says %v (%v)", pending, err)
	}
	if n, err := b.r.leases.Book(ctx, leaseID); err != nil || n != 1 {
		t.Fatalf("Book booked %d (%v), want adm-3 alone", n, err)
	}
	if got := booked(); !slices.Equal(got, ids) {
		t.Fatalf("after Book, reserve entries of %v, want %v", got, ids)
	}
	if pending, err := b.r.acct.LeasePending(ctx, leaseID); err != nil || pending {
		t.Fatalf("every admission is booked, LeasePending says %v (%v)", pending, err)
	}
	if _, err := b.r.acct.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: "adm-3", InputTokens: 10, OutputTokens: 10}); err != nil {
		t.Fatal(err)
	}
	if err := h.Return(ctx); err != nil {
		t.Fatal(err)
	}
	b.verify(t, "acme")
}
