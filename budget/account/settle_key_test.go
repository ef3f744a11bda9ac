package account_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

func withKey(p account.ReserveParams, key string) account.ReserveParams {
	p.IdempotencyKey, p.RequestHash = key, []byte("hash of "+key)
	return p
}

// hits is a gateway's reservation: its hits as input tokens at weight one.
func hits(tenantID string, n int64) account.ReserveParams {
	return account.ReserveParams{TenantID: tenantID, Estimate: estimator.Estimate{Model: "gpt-4o", InputTokens: n, Cost: n,
		InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne}}
}

func balance(t *testing.T, b *testBundle, id string) int64 {
	t.Helper()
	var micro int64
	if err := b.pool.QueryRow(ctx, `SELECT tokens_micro FROM tenants WHERE id = $1`, id).Scan(&micro); err != nil {
		t.Fatal(err)
	}
	return micro / rule.Micro
}

// TestSettleAndReleaseByIdempotencyKey: a settle or release may name its
// admission by the tenant's live Idempotency-Key instead of its id, found
// in the decision's own transaction: it settles that admission, replays
// like a settle by id, and is ErrAdmissionNotFound for an unknown key,
// another tenant's key, or one older than 24 h. Naming it both ways or
// neither is invalid and changes nothing.
func TestSettleAndReleaseByIdempotencyKey(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	b.tenant(t, "acme", limits(1000, "1"))
	b.tenant(t, "globex", limits(1000, "1"))
	r, err := b.store.Reserve(ctx, withKey(reserveFor("acme", 100), "req-1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Reserve(ctx, withKey(reserveFor("globex", 100), "req-g")); err != nil {
		t.Fatal(err)
	}

	st, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", IdempotencyKey: "req-1", InputTokens: 30, OutputTokens: 20})
	if err != nil || st.Admission.ID != r.AdmissionID || st.Replayed || *st.Admission.ActualInput != 30 {
		t.Fatalf("settle by key: %+v %v", st, err)
	}
	if got := balance(t, b, "acme"); got != 950 {
		t.Fatalf("balance %d, want 950", got)
	}
	st, err = b.store.Settle(ctx, account.SettleParams{TenantID: "acme", IdempotencyKey: "req-1", InputTokens: 30, OutputTokens: 20})
	if err != nil || !st.Replayed || st.Admission.ID != r.AdmissionID {
		t.Fatalf("settle by key again: %+v %v", st, err)
	}
	if err := fst(b.store.Settle(ctx, account.SettleParams{TenantID: "acme", IdempotencyKey: "req-1", InputTokens: 31})); !errors.Is(err, rule.ErrConflict) {
		t.Fatalf("other usage: %v", err)
	}

	before := map[string]state{"acme": b.state(t, "acme"), "globex": b.state(t, "globex")}
	var inv *rule.InvalidError
	for _, c := range []struct {
		p    account.SettleParams
		want error
	}{
		{account.SettleParams{TenantID: "acme", IdempotencyKey: "nope", InputTokens: 1}, rule.ErrAdmissionNotFound},
		{account.SettleParams{TenantID: "acme", IdempotencyKey: "req-g", InputTokens: 1}, rule.ErrAdmissionNotFound}, // globex's key
		{account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, IdempotencyKey: "req-1", InputTokens: 30, OutputTokens: 20}, nil},
		{account.SettleParams{TenantID: "acme", InputTokens: 30, OutputTokens: 20}, nil},
	} {
		err := fst(b.store.Settle(ctx, c.p))
		switch {
		case c.want != nil && !errors.Is(err, c.want):
			t.Fatalf("%+v: %v, want %v", c.p, err, c.want)
		case c.want == nil && (!errors.As(err, &inv) || inv.Field != "admission_id"):
			t.Fatalf("%+v: %v, want an invalid admission_id", c.p, err)
		}
	}
	if err := fst(b.store.Release(ctx, account.ReleaseParams{TenantID: "acme"})); !errors.As(err, &inv) {
		t.Fatalf("a release naming nothing: %v", err)
	}
	for id, s := range before {
		if after := b.state(t, id); after != s {
			t.Fatalf("%s changed though every request was refused", id)
		}
	}

	// Release by key.
	r2, err := b.store.Reserve(ctx, withKey(reserveFor("acme", 200), "req-2"))
	if err != nil {
		t.Fatal(err)
	}
	st, err = b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", IdempotencyKey: "req-2"})
	if err != nil || st.Admission.ID != r2.AdmissionID || st.Admission.State != account.StateReleased || balance(t, b, "acme") != 950 {
		t.Fatalf("release by key: %+v %v (balance %d)", st, err, balance(t, b, "acme"))
	}

	// A key lives 24 h.
	if _, err := b.store.Reserve(ctx, withKey(reserveFor("acme", 10), "req-3")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(24*time.Hour + time.Second)
	if err := fst(b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", IdempotencyKey: "req-3"})); !errors.Is(err, rule.ErrAdmissionNotFound) {
		t.Fatalf("a key older than 24 h: %v", err)
	}
}

// TestSettleByKeyInTheReservesBatch: a settle naming the key of a reserve
// decided earlier in the same batch settles that admission.
func TestSettleByKeyInTheReservesBatch(t *testing.T) {
	t.Parallel()
	b, _ := setupFrozen(t)
	b.tenant(t, "acme", limits(1000, "1"))
	rp := withKey(reserveFor("acme", 100), "req-1")
	res, err := b.store.Decide(ctx, "acme", []account.Op{
		{Reserve: &rp},
		{Settle: &account.SettleParams{TenantID: "acme", IdempotencyKey: "req-1", InputTokens: 10, OutputTokens: 10}},
	})
	if err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("%v %+v", err, res)
	}
	if res[1].Settlement.Admission.ID != res[0].Reservation.AdmissionID || balance(t, b, "acme") != 980 {
		t.Fatalf("settled %s, reserved %s; balance %d", res[1].Settlement.Admission.ID, res[0].Reservation.AdmissionID, balance(t, b, "acme"))
	}
	b.verify(t, "acme")
}

// TestSettleAsARefund: RefundTokens states the usage as a refund of the
// estimate (a gateway's negative hits): the actual input is the cost less
// the refund, never below 0, and no output. It excludes other usage.
func TestSettleAsARefund(t *testing.T) {
	t.Parallel()
	b, _ := setupFrozen(t)
	b.tenant(t, "acme", limits(1000, "1"))
	for _, c := range []struct {
		key             string
		refund, charged int64
	}{
		{"rls-1", 30, 70},
		{"rls-2", 150, 0},
	} {
		if _, err := b.store.Reserve(ctx, withKey(hits("acme", 100), c.key)); err != nil {
			t.Fatal(err)
		}
		before := balance(t, b, "acme")
		st, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", IdempotencyKey: c.key, RefundTokens: c.refund})
		if err != nil || *st.Admission.ActualInput != c.charged || *st.Admission.ActualOutput != 0 || *st.Admission.ActualCost != c.charged {
			t.Fatalf("refund %d: %+v %v", c.refund, st, err)
		}
		if got := balance(t, b, "acme"); got != before+100-c.charged {
			t.Fatalf("refund %d: balance %d, want %d", c.refund, got, before+100-c.charged)
		}
		// The same refund again is a replay.
		if st, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", IdempotencyKey: c.key, RefundTokens: c.refund}); err != nil || !st.Replayed {
			t.Fatalf("refund %d again: %+v %v", c.refund, st, err)
		}
	}
	var inv *rule.InvalidError
	for _, p := range []account.SettleParams{
		{TenantID: "acme", IdempotencyKey: "rls-1", RefundTokens: -1},
		{TenantID: "acme", IdempotencyKey: "rls-1", RefundTokens: 5, InputTokens: 5},
		{TenantID: "acme", IdempotencyKey: "rls-1", RefundTokens: 5, OutputTokens: 5},
	} {
		if err := fst(b.store.Settle(ctx, p)); !errors.As(err, &inv) || inv.Field != "refund_tokens" {
			t.Fatalf("%+v: %v", p, err)
		}
	}
	b.verify(t, "acme")
}

// TestReleaseByKeyGivesThePoolBack: the pool an admission named by key
// drew on is locked with it and corrected.
func TestReleaseByKeyGivesThePoolBack(t *testing.T) {
	t.Parallel()
	b, _ := setupFrozen(t)
	b.tenant(t, "acme", limits(1_000_000, "1000"))
	if err := b.store.CreatePool(ctx, "gpu", rule.PoolLimits{TokensCapacity: 100, TokensRateMicro: rule.Micro}); err != nil {
		t.Fatal(err)
	}
	if err := b.store.RoutePool(ctx, "gpt-4o", "gpu"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Reserve(ctx, withKey(reserveFor("acme", 80), "req-1")); err != nil {
		t.Fatal(err)
	}
	st, err := b.store.Release(ctx, account.ReleaseParams{TenantID: "acme", IdempotencyKey: "req-1"})
	if err != nil || st.Admission.PoolID != "gpu" {
		t.Fatalf("release by key: %+v %v", st, err)
	}
	pools, err := b.store.Pools(ctx)
	if err != nil || pools[0].TokensMicro != 100*rule.Micro {
		t.Fatalf("pool after the release: %+v %v", pools, err)
	}
}

// TestCachedInputPricedInTheDecision: a settle's cached input tokens are
// priced at the cached-input weight of the admission's model in the
// store's model table, which the admission records as its effective
// input; the usage bounds apply to the raw tokens, before the weights. Cached tokens outside 0..input are refused
// and nothing changes.
func TestCachedInputPricedInTheDecision(t *testing.T) {
	t.Parallel()
	b, _ := setupFrozen(t)
	m, _ := estimator.DefaultTable().Lookup("gpt-4o")
	m.CachedInputWeightMicro = estimator.WeightOne / 2
	m.CacheWriteWeightMicro = 2 * estimator.WeightOne
	table, err := estimator.DefaultTable().With([]estimator.Model{m})
	if err != nil {
		t.Fatal(err)
	}
	b.store.WithModels(func() *estimator.Table { return table })
	b.tenant(t, "acme", limits(1_000_000, "1"))

	r := b.mustReserve(t, "acme", 100)
	st, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 40, CachedInputTokens: 30, OutputTokens: 20})
	// 10 uncached + 30 cached at half weight = 25 input; 25 + 20 charged.
	if err != nil || *st.Admission.ActualInput != 25 || *st.Admission.ActualCost != 45 || balance(t, b, "acme") != 1_000_000-45 {
		t.Fatalf("settle with cached input: %+v %v (balance %d)", st, err, balance(t, b, "acme"))
	}
	st, err = b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 40, CachedInputTokens: 30, OutputTokens: 20})
	if err != nil || !st.Replayed {
		t.Fatalf("the same settle again: %+v %v", st, err)
	}

	// The bounds apply to the raw tokens, before any weight (issue 36 P2):
	// 200,000 prompt tokens never fit gpt-4o's 128,000-token window, cached
	// or not; 100,000 written to the cache at a weight of 2 do, and are
	// charged as 200,000.
	r2 := b.mustReserve(t, "acme", 100)
	for _, cached := range []int64{0, 200_000} {
		if err := fst(b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r2.AdmissionID, InputTokens: 200_000,
			CachedInputTokens: cached, OutputTokens: 10})); !errors.Is(err, rule.ErrUsageOutOfBounds) {
			t.Fatalf("200,000 input tokens, %d cached: %v", cached, err)
		}
	}
	st, err = b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r2.AdmissionID, InputTokens: 100_000, CacheWriteTokens: 100_000, OutputTokens: 10})
	if err != nil || *st.Admission.ActualInput != 200_000 || *st.Admission.ActualCost != 200_010 {
		t.Fatalf("100,000 input tokens written to the cache: %+v %v", st, err)
	}

	r3 := b.mustReserve(t, "acme", 100)
	before := b.state(t, "acme")
	var ue *rule.UsageError
	for _, p := range []account.SettleParams{
		{TenantID: "acme", AdmissionID: r3.AdmissionID, InputTokens: 10, CachedInputTokens: 11},
		{TenantID: "acme", AdmissionID: r3.AdmissionID, InputTokens: 10, CachedInputTokens: -1},
		{TenantID: "acme", AdmissionID: r3.AdmissionID, CachedInputTokens: 1},
	} {
		if err := fst(b.store.Settle(ctx, p)); !errors.As(err, &ue) || ue.Field != "prompt_tokens_details.cached_tokens" {
			t.Fatalf("%+v: %v", p, err)
		}
	}
	var inv *rule.InvalidError
	if err := fst(b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r3.AdmissionID, RefundTokens: 5, CachedInputTokens: 1})); !errors.As(err, &inv) {
		t.Fatalf("a refund with cached tokens: %v", err)
	}
	if after := b.state(t, "acme"); after != before {
		t.Fatal("a refused settle changed the tenant")
	}
	b.verify(t, "acme")
}
