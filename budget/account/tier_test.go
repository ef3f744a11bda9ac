package account_test

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

// tierPrice stores model's price at one service tier, effective from
// (which may be in the past, as price does), with a long-context bracket
// above longAbove input tokens when longAbove > 0.
func tierPrice(t *testing.T, b *testBundle, model, tier string, from time.Time, in, out, longAbove, longIn, longOut int64) {
	t.Helper()
	var th, li, lo *int64
	if longAbove > 0 {
		th, li, lo = &longAbove, &longIn, &longOut
	}
	_, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, service_tier, effective_from, input_micro, output_micro,
		long_context_threshold, long_input_micro, long_output_micro, created_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'test')`,
		model, tier, from, in, out, th, li, lo)
	if err != nil {
		t.Fatal(err)
	}
}

// tieredPrices prices gpt-4.1 (a 1M-token window) per million tokens:
// default 2 in / 8 out; flex 1 / 4, the whole call at 2 / 6 above 200 000
// input tokens; priority 3.50 / 14, at 7 / 28 above 200 000. Batch has no
// row: it is charged at the default tier's.
func tieredPrices(t *testing.T, b *testBundle, from time.Time) {
	t.Helper()
	tierPrice(t, b, "gpt-4.1", estimator.TierDefault, from, 2_000_000, 8_000_000, 0, 0, 0)
	tierPrice(t, b, "gpt-4.1", estimator.TierFlex, from, 1_000_000, 4_000_000, 200_000, 2_000_000, 6_000_000)
	tierPrice(t, b, "gpt-4.1", estimator.TierPriority, from, 3_500_000, 14_000_000, 200_000, 7_000_000, 28_000_000)
}

// tierReserve reserves a gpt-4.1 call of in and out tokens asking for tier.
func tierReserve(t *testing.T, s *account.Store, tenant, tier string, in, out int64) *account.Reservation {
	t.Helper()
	p := account.ReserveParams{TenantID: tenant, Estimate: estimator.Estimate{Model: "gpt-4.1", InputTokens: in, OutputTokens: out,
		Cost: in + out, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne, ServiceTier: tier}}
	r, err := s.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (b *testBundle) money(t *testing.T, tenant, id string) (estimate, actual int64, tier string) {
	t.Helper()
	a, err := b.store.AdmissionGet(ctx, tenant, id)
	if err != nil || a.MoneyEstimate == nil {
		t.Fatalf("admission %s: %+v, %v", id, a, err)
	}
	if a.MoneyActual != nil {
		actual = *a.MoneyActual
	}
	return *a.MoneyEstimate, actual, a.PriceTier
}

// A request asking for flex is reserved at the flex row, and a settle
// whose usage names no tier charges the tier it was reserved at; both
// entries name the tier.
func TestTierFlexReservationPricedAtFlexRow(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	tieredPrices(t, b, clock.Now().Add(-time.Hour))
	b.tenant(t, "acme", limits(10_000_000, "1000"))

	r := tierReserve(t, b.store, "acme", estimator.TierFlex, 100_000, 10_000)
	// 100 000 * 1 + 10 000 * 4 = 0.14 (0.28 at the default tier).
	if est, _, tier := b.money(t, "acme", r.AdmissionID); est != 140_000 || tier != estimator.TierFlex {
		t.Fatalf("reserved %d at %q, want 140000 at flex", est, tier)
	}
	if e := lastEntry(t, b, "acme"); *e.MoneyMicro != 140_000 || !strings.Contains(e.Detail, `"service_tier":"flex","price_tier":"flex"`) {
		t.Fatalf("reserve entry %d %q", *e.MoneyMicro, e.Detail)
	}
	if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 100_000, OutputTokens: 5_000}); err != nil {
		t.Fatal(err)
	}
	// 0.10 + 0.02 at flex.
	if _, act, _ := b.money(t, "acme", r.AdmissionID); act != 120_000 {
		t.Fatalf("settled %d, want 120000 at flex", act)
	}
	if e := lastEntry(t, b, "acme"); e.Kind != ledger.KindSettle || *e.MoneyMicro != -20_000 || !strings.Contains(e.Detail, `"service_tier":"flex","price_tier":"flex"`) {
		t.Fatalf("settle entry %s %d %q", e.Kind, *e.MoneyMicro, e.Detail)
	}
	b.verify(t, "acme")
}

// A request reserved at the default tier whose response reports priority
// is settled at the priority row in effect when it was reserved, not at a
// priority price added since; a usage naming no tier it does not know is
// refused, naming service_tier, with nothing moved.
func TestTierResponseReportingPrioritySettlesAtPriority(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	tieredPrices(t, b, clock.Now().Add(-time.Hour))
	b.tenant(t, "acme", limits(10_000_000, "1000"))

	r := tierReserve(t, b.store, "acme", "", 100_000, 10_000)
	if est, _, tier := b.money(t, "acme", r.AdmissionID); est != 280_000 || tier != estimator.TierDefault {
		t.Fatalf("reserved %d at %q, want 280000 at default", est, tier)
	}
	if e := lastEntry(t, b, "acme"); strings.Contains(e.Detail, "service_tier") {
		t.Fatalf("a default-tier reserve names a tier: %q", e.Detail)
	}
	clock.Advance(time.Minute)
	tierPrice(t, b, "gpt-4.1", estimator.TierPriority, clock.Now(), 10_000_000, 40_000_000, 0, 0, 0)
	clock.Advance(time.Minute)

	var inv *rule.InvalidError
	_, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 1, ServiceTier: "scale"})
	if !errors.As(err, &inv) || inv.Field != "service_tier" {
		t.Fatalf("a settle at tier scale: %v", err)
	}
	if a, _ := b.store.AdmissionGet(ctx, "acme", r.AdmissionID); a.State != account.StateReserved {
		t.Fatalf("a refused settle ended the admission: %s", a.State)
	}

	if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 100_000, OutputTokens: 5_000,
		ServiceTier: estimator.TierPriority}); err != nil {
		t.Fatal(err)
	}
	// 100 000 * 3.50 + 5 000 * 14 = 0.42, at the reserve's priority row.
	if _, act, _ := b.money(t, "acme", r.AdmissionID); act != 420_000 {
		t.Fatalf("settled %d, want 420000 at priority", act)
	}
	e := lastEntry(t, b, "acme")
	if *e.MoneyMicro != 140_000 || !strings.Contains(e.Detail, `"service_tier":"priority","price_tier":"priority"`) {
		t.Fatalf("settle entry %d %q", *e.MoneyMicro, e.Detail)
	}
	var sum int64
	if err := b.pool.QueryRow(ctx, `SELECT sum(money_micro) FROM ledger_entries WHERE tenant_id = 'acme'`).Scan(&sum); err != nil || sum != 420_000 {
		t.Fatalf("the ledger moved %d (%v), want 420000", sum, err)
	}
	b.verify(t, "acme")
}

// Long context and tier together: above the tier's threshold the whole
// call is priced at its long rates, at reserve (by the estimate's input)
// and at settle (by the usage's), each at its own tier; at the threshold
// exactly it is not.
func TestTierWithLongContext(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	tieredPrices(t, b, clock.Now().Add(-time.Hour))
	b.tenant(t, "acme", limits(100_000_000, "1000000"))

	for _, tc := range []struct {
		name                    string
		reserveIn, settleIn     int64
		wantEstimate, wantMoney int64
	}{
		// flex long: 250 000 * 2 + 10 000 * 6 = 0.56; priority long:
		// 300 000 * 7 + 10 000 * 28 = 2.38.
		{"both above", 250_000, 300_000, 560_000, 2_380_000},
		// flex long 0.56; priority standard: 150 000 * 3.5 + 10 000 * 14 = 0.665.
		{"reserved above, used below", 250_000, 150_000, 560_000, 665_000},
		// flex standard: 200 000 * 1 + 10 000 * 4 = 0.24 (the threshold
		// is not above it); priority long: 200 001 * 7 + 10 000 * 28 =
		// 1.680007.
		{"at the threshold, used above", 200_000, 200_001, 240_000, 1_680_007},
	} {
		r := tierReserve(t, b.store, "acme", estimator.TierFlex, tc.reserveIn, 10_000)
		if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: tc.settleIn,
			OutputTokens: 10_000, ServiceTier: estimator.TierPriority}); err != nil {
			t.Fatal(err)
		}
		if est, act, _ := b.money(t, "acme", r.AdmissionID); est != tc.wantEstimate || act != tc.wantMoney {
			t.Errorf("%s: reserved %d, settled %d; want %d, %d", tc.name, est, act, tc.wantEstimate, tc.wantMoney)
		}
	}
	b.verify(t, "acme")
}

// A tier without a row of its own is priced at the default tier's row,
// at reserve and at settle, and the entries say so; a row added for it
// later prices the admissions reserved after it, not those before.
func TestTierWithoutARowFallsBackToDefault(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	tierPrice(t, b, "gpt-4.1", estimator.TierDefault, clock.Now().Add(-time.Hour), 2_000_000, 8_000_000, 0, 0, 0)
	b.tenant(t, "acme", limits(10_000_000, "1000"))

	before := tierReserve(t, b.store, "acme", estimator.TierFlex, 100_000, 10_000)
	if est, _, tier := b.money(t, "acme", before.AdmissionID); est != 280_000 || tier != estimator.TierDefault {
		t.Fatalf("reserved %d at %q, want 280000 at the default row", est, tier)
	}
	if e := lastEntry(t, b, "acme"); !strings.Contains(e.Detail, `"service_tier":"flex","price_tier":"default"`) {
		t.Fatalf("reserve entry %q", e.Detail)
	}
	clock.Advance(time.Minute)
	tierPrice(t, b, "gpt-4.1", estimator.TierBatch, clock.Now(), 1_000_000, 4_000_000, 0, 0, 0)
	clock.Advance(time.Minute)
	after := tierReserve(t, b.store, "acme", "", 100_000, 10_000)
	for _, r := range []*account.Reservation{before, after} {
		if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 100_000,
			OutputTokens: 5_000, ServiceTier: estimator.TierBatch}); err != nil {
			t.Fatal(err)
		}
	}
	// Before the batch row: 0.20 + 0.04 at the default row; after: 0.10 + 0.02.
	if _, act, _ := b.money(t, "acme", before.AdmissionID); act != 240_000 {
		t.Fatalf("settled %d, want 240000 at the default row", act)
	}
	if _, act, _ := b.money(t, "acme", after.AdmissionID); act != 120_000 {
		t.Fatalf("settled %d, want 120000 at the batch row", act)
	}
	if e := lastEntry(t, b, "acme"); !strings.Contains(e.Detail, `"service_tier":"batch","price_tier":"batch"`) {
		t.Fatalf("settle entry %q", e.Detail)
	}
	b.verify(t, "acme")
}

// 200 callers over two replicas reserve at every tier and settle at
// another (batch has no row: the default's), on one tenant counted by a
// money window: the ledger's money is exactly the sum of what each call
// cost at the tier it reported, and the window counted exactly that.
func TestConcurrentSettlesAtEveryTier(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	tieredPrices(t, b, time.Now().Add(-time.Hour))
	l := limits(100_000_000, "1000000")
	day, _ := rule.ParseWindow("day", "UTC", "", "")
	l.Windows = []rule.WindowLimit{{Name: "spend", Window: day, Counts: rule.CountMoney, Limit: 1_000_000_000}}
	b.tenant(t, "acme", l)

	// cost is a call's money at a tier, per the rows of tieredPrices.
	cost := func(tier string, in, out int64) int64 {
		pin, pout := int64(2_000_000), int64(8_000_000)
		switch tier {
		case estimator.TierFlex:
			pin, pout = 1_000_000, 4_000_000
		case estimator.TierPriority:
			pin, pout = 3_500_000, 14_000_000
		}
		n := in*pin + out*pout
		return (n + 999_999) / 1_000_000
	}
	var want, settled atomic.Int64
	hammer(stores, func(g int, s *account.Store) {
		reserveTier, settleTier := estimator.ServiceTiers[g%4], estimator.ServiceTiers[(g/4+1)%4]
		in, out := int64(1_000+37*g), int64(500+11*(g%9))
		r, err := s.Reserve(ctx, account.ReserveParams{TenantID: "acme", Estimate: estimator.Estimate{Model: "gpt-4.1", InputTokens: in,
			OutputTokens: out, Cost: in + out, InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne, ServiceTier: reserveTier}})
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := s.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: in, OutputTokens: out / 2,
			ServiceTier: settleTier}); err != nil {
			t.Error(err)
			return
		}
		want.Add(cost(settleTier, in, out/2))
		settled.Add(1)
	})
	var sum int64
	var entries int
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(sum(money_micro), 0), count(money_micro) FROM ledger_entries WHERE tenant_id = 'acme'`).Scan(&sum, &entries); err != nil {
		t.Fatal(err)
	}
	snap, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if settled.Load() != 200 || sum != want.Load() || snap.Windows[0].Used != sum || entries != 400 {
		t.Fatalf("%d settled; the ledger moved %d over %d entries, the window counted %d; want %d", settled.Load(), sum, entries, snap.Windows[0].Used, want.Load())
	}
	b.verify(t, "acme")
}

// A settle kept for an admission not replayed yet keeps the tier its usage
// reported: the replay's settle charges that tier.
func TestKeptSettleKeepsItsTier(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	tieredPrices(t, b, clock.Now().Add(-time.Hour))
	l := limits(10_000_000, "1000")
	l.OnStoreUnavailable = rule.PolicyLocal
	b.tenant(t, "acme", l)
	err := fst(b.store.Settle(ctx, account.SettleParams{TenantID: "acme", IdempotencyKey: "k1", InputTokens: 100_000, OutputTokens: 5_000,
		ServiceTier: estimator.TierPriority, Defer: local}))
	if !errors.Is(err, account.ErrDeferred) {
		t.Fatalf("settle before the replay: %v", err)
	}
	clock.Advance(time.Second)
	p := replayed("acme", "k1", 0, clock.Now().Add(-time.Minute))
	p.Estimate = estimator.Estimate{Model: "gpt-4.1", InputTokens: 100_000, OutputTokens: 10_000, Cost: 110_000,
		InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne, ServiceTier: estimator.TierFlex}
	if _, err := b.store.ReplayReserve(ctx, p); err != nil {
		t.Fatal(err)
	}
	// Reserved at flex (0.10 + 0.04), settled at priority (0.35 + 0.07).
	if est, act, tier := b.money(t, "acme", p.AdmissionID); est != 140_000 || act != 420_000 || tier != estimator.TierFlex {
		t.Fatalf("replayed: %d at %q, settled %d; want 140000 at flex, 420000", est, tier, act)
	}
}
