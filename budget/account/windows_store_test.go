package account_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

func window(t *testing.T, name, unit, zone, resetAt string, tokens int64) rule.WindowLimit {
	t.Helper()
	cal, err := rule.ParseWindow(unit, zone, resetAt, "")
	if err != nil {
		t.Fatal(err)
	}
	return rule.WindowLimit{Name: name, Window: cal, Counts: rule.CountTokens, Limit: tokens}
}

// Several windows at once, each calendar-aligned in its own zone, on a
// frozen clock that crosses both zones' daylight saving changes: each
// refuses when it is spent, names itself, and answers the exact time to
// its own reset; each resets at its own boundary and no other.
func TestWindowsResetInTheirZonesAcrossDST(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	// Saturday 2026-03-07 23:00 America/New_York (EST, UTC-5): the US
	// springs forward on Sunday 2026-03-08 at 02:00. Europe/Paris springs
	// forward on 2026-03-29.
	ny, _ := time.LoadLocation("America/New_York")
	clock.now = time.Date(2026, 3, 7, 23, 0, 0, 0, ny)
	l := limits(1_000_000, "1000000")
	l.Windows = []rule.WindowLimit{
		window(t, "ny-day", "day", "America/New_York", "00:00", 100),
		window(t, "paris-week", "week", "Europe/Paris", "09:00", 250),
	}
	b.tenant(t, "acme", l)

	b.mustReserve(t, "acme", 100)
	rej := rejected(t, fst(b.reserve(t, "acme", 1)), rule.LimitPeriodBudget)
	midnight := time.Date(2026, 3, 8, 0, 0, 0, 0, ny)
	if rej.Window != "ny-day" || rej.RetryAfter != midnight.Sub(clock.Now()) {
		t.Fatalf("refused by %q, retry after %s; want ny-day, %s", rej.Window, rej.RetryAfter, midnight.Sub(clock.Now()))
	}

	// The New York day resets at its midnight; the Paris week does not.
	clock.now = midnight
	b.mustReserve(t, "acme", 100)
	// Sunday 2026-03-08 is 23 hours long in New York: the next reset is at
	// 2026-03-09 00:00 EDT, 23 h after this one.
	clock.Advance(22 * time.Hour)
	rej = rejected(t, fst(b.reserve(t, "acme", 1)), rule.LimitPeriodBudget)
	if rej.Window != "ny-day" || rej.RetryAfter != time.Hour {
		t.Fatalf("on the 23 h day, refused by %q with %s to its reset; want ny-day in 1h", rej.Window, rej.RetryAfter)
	}
	clock.Advance(time.Hour)
	b.mustReserve(t, "acme", 50)
	// 250 spent in the Paris week (which began Monday 2026-03-02 09:00 CET).
	rej = rejected(t, fst(b.reserve(t, "acme", 1)), rule.LimitPeriodBudget)
	paris, _ := time.LoadLocation("Europe/Paris")
	nextWeek := time.Date(2026, 3, 9, 9, 0, 0, 0, paris)
	if rej.Window != "paris-week" || rej.RetryAfter != nextWeek.Sub(clock.Now()) {
		t.Fatalf("refused by %q in %s; want paris-week in %s", rej.Window, rej.RetryAfter, nextWeek.Sub(clock.Now()))
	}
	snap, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil || len(snap.Windows) != 2 {
		t.Fatalf("snapshot %+v: %v", snap.Windows, err)
	}
	if w := snap.Windows[1]; w.Used != 250 || !w.Start.Equal(time.Date(2026, 3, 2, 9, 0, 0, 0, paris)) || !w.End.Equal(nextWeek) {
		t.Fatalf("paris week %+v", w)
	}

	// Paris springs forward on Sunday 2026-03-29 (02:00 -> 03:00): the week
	// from Monday 03-23 09:00 CET to Monday 03-30 09:00 CEST is 167 hours.
	weekStart := time.Date(2026, 3, 23, 9, 0, 0, 0, paris)
	clock.now = weekStart
	b.mustReserve(t, "acme", 100)
	clock.now = weekStart.Add(120 * time.Hour) // another New York day
	b.mustReserve(t, "acme", 100)
	clock.now = weekStart.Add(166 * time.Hour) // and another
	b.mustReserve(t, "acme", 50)
	rej = rejected(t, fst(b.reserve(t, "acme", 1)), rule.LimitPeriodBudget)
	if rej.Window != "paris-week" || rej.RetryAfter != time.Hour {
		t.Fatalf("at the end of the 167 h week, refused by %q in %s; want paris-week in 1h", rej.Window, rej.RetryAfter)
	}
	tally := b.verify(t, "acme")
	if tally.LastSeq == 0 {
		t.Fatal("no ledger")
	}
	e := lastEntry(t, b, "acme")
	if e.Windows != "ny-day=50,paris-week=250" {
		t.Fatalf("the last entry records windows %q", e.Windows)
	}
}

func lastEntry(t *testing.T, b *testBundle, id string) ledger.Entry {
	t.Helper()
	es, err := ledger.EntryList(ctx, b.pool, id, 0, 100000)
	if err != nil || len(es) == 0 {
		t.Fatalf("entries of %s: %v", id, err)
	}
	return es[len(es)-1]
}

// price stores a price for model, effective from (which may be in the past,
// for frozen clocks: the API refuses that, a test may write the row).
func price(t *testing.T, b *testBundle, model string, from time.Time, in, out int64) {
	t.Helper()
	_, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, effective_from, input_micro, output_micro, created_by)
		VALUES ($1, $2, $3, $4, 'test')`, model, from, in, out)
	if err != nil {
		t.Fatal(err)
	}
}

// A money window counts what admissions cost at the price in effect when
// they were reserved; a settle is priced at the reserve's price whatever
// took effect in between; every ledger entry records the money it moved.
func TestMoneyWindowSettlesAtTheReservesPrice(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	// gpt-4o at 2.50 in / 10.00 out per million tokens.
	price(t, b, "gpt-4o", clock.Now().Add(-time.Hour), 2_500_000, 10_000_000)
	l := limits(10_000_000, "1000")
	daily, _ := rule.ParseWindow("day", "Europe/Paris", "", "")
	l.Windows = []rule.WindowLimit{{Name: "spend", Window: daily, Counts: rule.CountMoney, Limit: 1_000_000}} // 1.00
	b.tenant(t, "acme", l)

	p := reserve(0)
	p.TenantID = "acme"
	p.Estimate.InputTokens, p.Estimate.OutputTokens, p.Estimate.Cost = 100_000, 20_000, 120_000
	r, err := b.store.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	// 100 000 * 2.5 + 20 000 * 10 = 0.25 + 0.20 = 0.45
	if e := lastEntry(t, b, "acme"); e.MoneyMicro == nil || *e.MoneyMicro != 450_000 {
		t.Fatalf("reserve entry money %v, want 450000", e.MoneyMicro)
	}
	// The price doubles before the settle.
	clock.Advance(time.Minute)
	price(t, b, "gpt-4o", clock.Now(), 5_000_000, 20_000_000)
	clock.Advance(time.Minute)
	if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 100_000, OutputTokens: 10_000}); err != nil {
		t.Fatal(err)
	}
	// At the reserve's price: 0.25 + 0.10 = 0.35, so -0.10 moved.
	if e := lastEntry(t, b, "acme"); e.MoneyMicro == nil || *e.MoneyMicro != -100_000 || e.Kind != ledger.KindSettle {
		t.Fatalf("settle entry money %v (%s), want -100000", e.MoneyMicro, e.Kind)
	}
	snap, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil || snap.Windows[0].Used != 350_000 {
		t.Fatalf("window used %+v (%v), want 350000", snap.Windows, err)
	}
	a, err := b.store.AdmissionGet(ctx, "acme", r.AdmissionID)
	if err != nil || a.MoneyActual == nil || *a.MoneyActual != 350_000 || *a.MoneyEstimate != 450_000 || a.PriceModel != "gpt-4o" {
		t.Fatalf("admission money %+v: %v", a, err)
	}
	// The next admission is priced at the new price: 100 000 in at 5.00 +
	// 20 000 out at 20.00 = 0.90; 0.35 + 0.90 > 1.00: refused, by the money
	// window, with the time to Paris midnight.
	_, err = b.store.Reserve(ctx, p)
	rej := rejected(t, err, rule.LimitPeriodBudget)
	paris, _ := time.LoadLocation("Europe/Paris")
	y, m, d := clock.Now().In(paris).Date()
	if want := time.Date(y, m, d+1, 0, 0, 0, 0, paris).Sub(clock.Now()); rej.Window != "spend" || rej.RetryAfter != want {
		t.Fatalf("refused by %q in %s, want spend in %s", rej.Window, rej.RetryAfter, want)
	}
	// The drift report in money: estimated 0.45, cost 0.35 at the
	// reserve's price, over-reserved by 0.10.
	rows, err := b.store.DriftReport(ctx, account.DriftParams{TenantID: "acme", From: clock.Now().Add(-time.Hour), To: clock.Now().Add(time.Hour)})
	if err != nil || len(rows) != 1 {
		t.Fatalf("drift %+v: %v", rows, err)
	}
	if r := rows[0]; r.Priced != 1 || r.EstimatedMoneyMicro.String() != "450000" || r.ActualMoneyMicro.String() != "350000" || r.MoneyDriftMicro.String() != "100000" {
		t.Fatalf("drift in money: %+v", r)
	}
	// A model with no price cannot be admitted where money is counted.
	q := reserve(10)
	q.TenantID, q.Estimate.Model = "acme", "unpriced-model"
	var inv *rule.InvalidError
	if _, err := b.store.Reserve(ctx, q); !errors.As(err, &inv) || inv.Field != "model" {
		t.Fatalf("an unpriced model under a money window: %v", err)
	}
	b.verify(t, "acme")
}

// A soft budget admits up to its limit plus the overage, never beyond;
// what it counted equals the ledger's money deltas exactly; 200 callers
// over two replicas (each with its own pool and price book).
func TestConcurrentMoneyWindowWithOverage(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	price(t, b, "gpt-4o", time.Now().Add(-time.Hour), 3_000_000, 12_000_000)
	l := limits(100_000_000, "1000000")
	month, _ := rule.ParseWindow("month", "America/Los_Angeles", "", "")
	// 0.50 with 20 % overage: refuses above 0.60.
	l.Windows = []rule.WindowLimit{{Name: "monthly", Window: month, Counts: rule.CountMoney, Limit: 500_000, OveragePercent: 20, Thresholds: []int64{50}}}
	b.tenant(t, "acme", l)
	var admitted, settled atomic.Int64
	hammer(stores, func(g int, s *account.Store) {
		for i := range 3 {
			p := reserve(0)
			p.TenantID = "acme"
			p.Estimate.InputTokens, p.Estimate.OutputTokens = int64(200+37*((g+i)%11)), int64(100+13*((g*7+i)%5))
			p.Estimate.Cost = p.Estimate.InputTokens + p.Estimate.OutputTokens
			r, err := s.Reserve(ctx, p)
			if errors.Is(err, rule.ErrRejected) {
				continue
			}
			if err != nil {
				t.Error(err)
				return
			}
			admitted.Add(1)
			if (g+i)%2 == 0 {
				if _, err := s.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID,
					InputTokens: p.Estimate.InputTokens, OutputTokens: p.Estimate.OutputTokens / 2}); err != nil {
					t.Error(err)
					return
				}
				settled.Add(1)
			}
		}
	})
	var sum int64
	var priced int
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(sum(money_micro), 0), count(money_micro) FROM ledger_entries WHERE tenant_id = 'acme'`).Scan(&sum, &priced); err != nil {
		t.Fatal(err)
	}
	snap, err := b.store.TenantSnapshot(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	used := snap.Windows[0].Used
	if used != sum || used > 600_000 || int64(priced) != admitted.Load()+settled.Load() {
		t.Fatalf("window used %d, ledger money %d over %d entries (%d admitted, %d settled); ceiling 600000", used, sum, priced, admitted.Load(), settled.Load())
	}
	// Demand (~600 requests of ~0.002) far exceeds the ceiling: it is
	// reached to within one request.
	if used < 600_000-5_000 {
		t.Fatalf("used %d of a 600000 ceiling", used)
	}
	b.verify(t, "acme")
}

// The price book a replica holds is never stale: a price another replica
// adds is used by this one's next decision.
func TestPriceBookFollowsOtherReplicas(t *testing.T) {
	t.Parallel()
	b, stores := replicas(t)
	// Room for both reserves: the replicas run on the real clock, so the
	// bucket must not depend on refill between them.
	b.tenant(t, "acme", limits(2_000_000, "1000"))
	if _, err := stores[0].Reserve(ctx, account.ReserveParams{TenantID: "acme", Estimate: reserve(10).Estimate}); err != nil {
		t.Fatal(err)
	}
	if e := lastEntry(t, b, "acme"); e.MoneyMicro != nil {
		t.Fatalf("money %d recorded without a price", *e.MoneyMicro)
	}
	if _, err := estimator.PriceInsert(ctx, stores1Pool(b), estimator.Price{Model: "gpt-4o", Currency: "USD", InputMicro: 1_000_000, OutputMicro: 1_000_000}); err != nil {
		t.Fatal(err)
	}
	if _, err := stores[0].Reserve(ctx, account.ReserveParams{TenantID: "acme", Estimate: reserve(1_000_000).Estimate}); err != nil {
		t.Fatal(err)
	}
	if e := lastEntry(t, b, "acme"); e.MoneyMicro == nil || *e.MoneyMicro != 1_000_000 {
		t.Fatalf("money %v after another replica added the price, want 1000000", e.MoneyMicro)
	}
}

func stores1Pool(b *testBundle) estimator.TxDB { return b.pool }

// A settle's money prices each part of its usage at the reserve's price:
// cache reads and writes, reasoning, and the rest.
func TestMoneyPricesEveryPartOfASettle(t *testing.T) {
	t.Parallel()
	b, clock := setupFrozen(t)
	// Per million: input 3, cached read 0.30, 5 min write 3.75, 1 h write 6,
	// output 15, reasoning 20.
	if _, err := b.pool.Exec(ctx, `INSERT INTO model_prices (model, effective_from, input_micro, output_micro, cached_input_micro,
		cache_write_5m_micro, cache_write_1h_micro, reasoning_output_micro, created_by)
		VALUES ('gpt-4o', $1, 3000000, 15000000, 300000, 3750000, 6000000, 20000000, 'test')`, clock.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	b.tenant(t, "acme", limits(10_000_000, "1000"))
	p := reserve(0)
	p.TenantID = "acme"
	p.Estimate.InputTokens, p.Estimate.OutputTokens, p.Estimate.Cost = 1_000_000, 100_000, 1_100_000
	r, err := b.store.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Settle(ctx, account.SettleParams{TenantID: "acme", AdmissionID: r.AdmissionID, InputTokens: 1_000_000,
		CachedInputTokens: 400_000, CacheWriteTokens: 100_000, CacheWrite1hTokens: 100_000, OutputTokens: 100_000, ReasoningTokens: 50_000}); err != nil {
		t.Fatal(err)
	}
	// uncached 400 000 * 3 = 1.20; read 400 000 * 0.30 = 0.12; writes
	// 100 000 * 3.75 + 100 000 * 6 = 0.975; output 50 000 * 15 = 0.75;
	// reasoning 50 000 * 20 = 1.00: 4.045. Reserved: 3 + 1.5 = 4.50.
	a, err := b.store.AdmissionGet(ctx, "acme", r.AdmissionID)
	if err != nil || *a.MoneyEstimate != 4_500_000 || *a.MoneyActual != 4_045_000 {
		t.Fatalf("money %v / %v: %v", a.MoneyEstimate, a.MoneyActual, err)
	}
	if e := lastEntry(t, b, "acme"); *e.MoneyMicro != 4_045_000-4_500_000 {
		t.Fatalf("settle entry moved %d", *e.MoneyMicro)
	}
}
