package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/ledger"
)

// BenchmarkVerifyRecords times what the invariant watch does on every
// replica: a verification of a tenant's new entries, here 40 bookings of a
// lease, each a record of 250 entries, between plain entries (10,040
// entries). It reports the time per entry verified.
//
//	go test -run '^$' -bench VerifyRecords ./ledger/
func BenchmarkVerifyRecords(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.New(b, nil)
	var head ledger.Head
	var balance int64
	at := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	seal := func(kind ledger.Kind, adm, lease string, delta int64) *ledger.Entry {
		balance += delta
		est := int64(7)
		e := &ledger.Entry{TenantID: "v", Kind: kind, CreatedAt: at, AdmissionID: adm, Model: "m", Estimate: &est,
			DeltaMicro: delta, BalanceMicro: balance, Actor: "lease", Detail: `{"lease":"L"}`, Lease: lease}
		head = head.Seal(e)
		return e
	}
	const bookings, per = 40, 250
	total := 0
	for i := range bookings {
		at = at.Add(time.Second)
		entries := []*ledger.Entry{seal(ledger.KindLeaseTake, "", "", 1000)}
		for j := range per {
			entries = append(entries, seal(ledger.KindReserve, fmt.Sprintf("adm-%d-%d", i, j), "L", 0))
		}
		batch := &pgx.Batch{}
		ledger.QueueInsert(batch, entries...)
		if err := pool.SendBatch(ctx, batch).Close(); err != nil {
			b.Fatal(err)
		}
		total += len(entries)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE ledger_rows"); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		t, err := ledger.VerifyFrom(ctx, pool, "v", ledger.Tally{}, 0)
		if err != nil || t.Entries != int64(total) || t.BalanceMicro != balance {
			b.Fatalf("verify: %+v, %v; want %d entries, balance %d", t, err, total, balance)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*total), "ns/entry")
}
