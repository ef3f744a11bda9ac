package ledger_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

// TestMoneySpentSumsEachSpan writes entries at known times and checks each
// span's sum: only the tenant's own entries, only from its start on (the
// start itself included), entries of no money counted as nothing, an
// admission reserved before the span counting its extra charge but not its
// refund (as a window counts), and the answers in the order asked.
func TestMoneySpentSumsEachSpan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	at := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	heads := map[string]ledger.Head{}
	var entries []*ledger.Entry
	add := func(tenant, admission string, kind ledger.Kind, ago time.Duration, money int64, priced bool) {
		e := &ledger.Entry{TenantID: tenant, AdmissionID: admission, Kind: kind, CreatedAt: at.Add(-ago), Actor: "test"}
		if priced {
			e.MoneyMicro = &money
		}
		heads[tenant] = heads[tenant].Seal(e)
		entries = append(entries, e)
	}
	const h, m = time.Hour, time.Minute
	add("a", "adm1", ledger.KindReserve, 2*h, 100, true)  // before the 1 h span
	add("a", "adm5", ledger.KindReserve, 2*h, 40, true)   // before the 1 h span
	add("a", "adm2", ledger.KindReserve, h, 1_000, true)  // exactly at its start: in it
	add("a", "adm1", ledger.KindSettle, 30*m, -30, true)  // a refund of adm1: the earlier span's
	add("a", "adm4", ledger.KindReserve, 20*m, 500, true) //
	add("a", "", ledger.KindLimits, 15*m, 0, false)       // no money
	add("a", "adm2", ledger.KindSettle, 10*m, 200, true)  // an extra charge of adm2
	add("a", "adm5", ledger.KindSettle, 5*m, 10, true)    // an extra charge of adm5: counts now
	add("a", "adm4", ledger.KindRelease, 0, -500, true)   // adm4 gives back its estimate
	add("b", "adm9", ledger.KindReserve, 0, 7, true)
	b := &pgx.Batch{}
	ledger.QueueInsert(b, entries...)
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	got, err := ledger.MoneySpent(ctx, pool, []ledger.SpanParams{
		{TenantID: "a", Since: at.Add(-h)},
		{TenantID: "b", Since: at.Add(-h)},
		{TenantID: "a", Since: at.Add(-3 * h)},
		{TenantID: "nobody", Since: at.Add(-3 * h)},
		{TenantID: "a", Since: at.Add(time.Second)},
	})
	if err != nil {
		t.Fatal(err)
	}
	// 1 h: adm2 1000+200, adm4 500-500, adm5's +10; not adm1's -30.
	// 3 h: everything: 100-30 + 40+10 + 1200 + 0.
	if want := []int64{1_210, 7, 1_320, 0, 0}; !slices.Equal(got, want) {
		t.Fatalf("spent %v, want %v", got, want)
	}
	if got, err := ledger.MoneySpent(ctx, pool, nil); err != nil || got != nil {
		t.Fatalf("no spans: %v %v", got, err)
	}
}

// TestMoneySpentIsWhatMoneyWindowsCount: on a frozen clock across a Paris
// midnight, admissions reserved before it are settled lower (a refund the
// new day does not get), higher (an extra charge it does), or released,
// and new ones are reserved, settled and left open by many callers at
// once, in a tree. At every level, each money window's Used equals the
// ledger's MoneySpent since the window's start, and a tokens window of the
// same calendar shows that same money.
func TestMoneySpentIsWhatMoneyWindowsCount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	now := time.Date(2026, 12, 4, 22, 50, 0, 0, time.UTC) // 23:50 in Paris
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	store := account.NewStore(pool).WithClock(clock)
	// gpt-4o at 2.50 in / 10.00 out per million tokens.
	if _, err := pool.Exec(ctx, `INSERT INTO model_prices (model, effective_from, input_micro, output_micro, created_by)
		VALUES ('gpt-4o', $1, 2500000, 10000000, 'test')`, now.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	windows := func(js ...rule.WindowJSON) []rule.WindowLimit {
		ws, err := rule.ParseWindows(js)
		if err != nil {
			t.Fatal(err)
		}
		return ws
	}
	money, tokens := "1000", int64(1_000_000_000)
	day := func(name string, m *string, tk *int64) rule.WindowJSON {
		return rule.WindowJSON{Name: name, Unit: "day", TimeZone: "Europe/Paris", Money: m, Tokens: tk}
	}
	for _, tn := range []struct{ id, parent string }{{"org", ""}, {"team", "org"}} {
		l := rule.Limits{TokensCapacity: 1_000_000_000, TokensRateMicro: rule.Micro,
			Windows: windows(day("spend", &money, nil), day("usage", nil, &tokens))}
		if _, err := store.CreateTenant(ctx, account.CreateTenantParams{ID: tn.id, Parent: tn.parent, Limits: l, Actor: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	est := estimator.Estimate{Model: "gpt-4o", InputTokens: 100_000, OutputTokens: 20_000, Cost: 120_000,
		InputWeightMicro: estimator.WeightOne, OutputWeightMicro: estimator.WeightOne} // 0.45
	reserve := func() string {
		t.Helper()
		r, err := store.Reserve(ctx, account.ReserveParams{TenantID: "team", Estimate: est})
		if err != nil {
			t.Error(err)
			return ""
		}
		return r.AdmissionID
	}
	settle := func(id string, in, out int64) {
		t.Helper()
		if _, err := store.Settle(ctx, account.SettleParams{TenantID: "team", AdmissionID: id, InputTokens: in, OutputTokens: out}); err != nil {
			t.Error(err)
		}
	}
	a, b, c := reserve(), reserve(), reserve()
	mu.Lock()
	now = now.Add(20 * time.Minute) // 00:10 in Paris: a new day
	mu.Unlock()
	settle(a, 100_000, 10_000) // 0.35: a refund of 0.10 to yesterday
	settle(b, 108_000, 20_000) // 0.47: 0.02 more, today
	if _, err := store.Release(ctx, account.ReleaseParams{TenantID: "team", AdmissionID: c}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := reserve()
			switch {
			case id == "":
			case i%3 == 0: // left open
			case i%3 == 1:
				settle(id, 100_000+int64(i)*300, 20_000-int64(i)*500)
			default:
				if _, err := store.Release(ctx, account.ReleaseParams{TenantID: "team", AdmissionID: id}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, id := range []string{"org", "team"} {
		snap, err := store.TenantSnapshot(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Windows) != 2 {
			t.Fatalf("%s windows %+v", id, snap.Windows)
		}
		spend, usage := snap.Windows[0], snap.Windows[1]
		spent, err := ledger.MoneySpent(ctx, pool, []ledger.SpanParams{{TenantID: id, Since: spend.Start}, {TenantID: id, Since: usage.Start}})
		if err != nil {
			t.Fatal(err)
		}
		if spend.Used <= 0 || spent[0] != spend.Used || spent[1] != spend.Used || !spend.Start.Equal(time.Date(2026, 12, 4, 23, 0, 0, 0, time.UTC)) {
			t.Fatalf("%s: the money window used %d since %s; the ledger says %d (%d for the tokens window)", id, spend.Used, spend.Start, spent[0], spent[1])
		}
	}
}
