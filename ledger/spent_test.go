package ledger_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

// TestMoneySpentSumsEachSpan writes entries at known times and checks each
// span's sum: only the tenant's own entries, only from its start on (the
// start itself included), entries of no money counted as nothing, and the
// answers in the order the spans were asked.
func TestMoneySpentSumsEachSpan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	at := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	money := func(n int64) *int64 { return &n }
	heads := map[string]ledger.Head{}
	var entries []*ledger.Entry
	add := func(tenant string, created time.Time, m *int64) {
		e := &ledger.Entry{TenantID: tenant, Kind: ledger.KindReserve, CreatedAt: created, Actor: "test", MoneyMicro: m}
		heads[tenant] = heads[tenant].Seal(e)
		entries = append(entries, e)
	}
	add("a", at.Add(-2*time.Hour), money(100))
	add("a", at.Add(-time.Hour), money(1_000)) // exactly at the start of the 1 h span: counted
	add("a", at.Add(-30*time.Minute), money(250))
	add("a", at.Add(-10*time.Minute), nil) // an entry of no priced admission
	add("a", at, money(-50))               // a release gives back its estimate
	add("b", at, money(7))
	b := &pgx.Batch{}
	ledger.QueueInsert(b, entries...)
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	got, err := ledger.MoneySpent(ctx, pool, []ledger.SpanParams{
		{TenantID: "a", Since: at.Add(-time.Hour)},
		{TenantID: "b", Since: at.Add(-time.Hour)},
		{TenantID: "a", Since: at.Add(-3 * time.Hour)},
		{TenantID: "nobody", Since: at.Add(-3 * time.Hour)},
		{TenantID: "a", Since: at.Add(time.Second)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{1_200, 7, 1_300, 0, 0}; !slices.Equal(got, want) {
		t.Fatalf("spent %v, want %v", got, want)
	}
	if got, err := ledger.MoneySpent(ctx, pool, nil); err != nil || got != nil {
		t.Fatalf("no spans: %v %v", got, err)
	}
}
