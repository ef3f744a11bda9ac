package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/ledger"
)

// olderEntryInsert is the ledger insert of the releases before 00038,
// which name ledger_entries: a replica of one still runs beside this
// release during a rolling upgrade.
const olderEntryInsert = `INSERT INTO ledger_entries (
    tenant_id, seq, kind, created_at, admission_id, model, estimate, actual,
    refill_micro, delta_micro, balance_micro, period_start, period_used, late,
    actor, reason, detail, prev_hash, hash, money_micro, windows
)
SELECT * FROM unnest(
    $1::text[], $2::bigint[], $3::text[], $4::timestamptz[], $5::text[], $6::text[], $7::bigint[], $8::bigint[],
    $9::bigint[], $10::bigint[], $11::bigint[], $12::timestamptz[], $13::bigint[], $14::boolean[],
    $15::text[], $16::text[], $17::text[], $18::bytea[], $19::bytea[], $20::bigint[], $21::text[]
)`

// TestLedgerRecordsUpgrade: the entries an older release wrote read the
// same through the view 00038 makes of ledger_entries, an older replica
// still inserting after the upgrade goes on appending to the same chains,
// and the chain verifies across the three.
func TestLedgerRecordsUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, m := migratorAt(t, 37)
	var head ledger.Head
	balance := int64(0)
	at := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	older := func(n int) []ledger.Entry {
		var out []ledger.Entry
		b := &pgx.Batch{}
		for i := range n {
			balance += 5
			e := ledger.Entry{TenantID: "acme", Kind: ledger.KindAdjust, CreatedAt: at.Add(time.Duration(i) * time.Second), DeltaMicro: 5, BalanceMicro: balance, Actor: "older", Reason: "r"}
			head = head.Seal(&e)
			b.Queue(olderEntryInsert, []string{e.TenantID}, []int64{e.Seq}, []string{string(e.Kind)}, []time.Time{e.CreatedAt},
				[]*string{nil}, []*string{nil}, []*int64{nil}, []*int64{nil}, []int64{0}, []int64{e.DeltaMicro}, []int64{e.BalanceMicro},
				[]*time.Time{nil}, []int64{0}, []bool{false}, []string{e.Actor}, []string{e.Reason}, []*string{nil},
				[][]byte{e.PrevHash}, [][]byte{e.Hash}, []*int64{nil}, []*string{nil})
			out = append(out, e)
		}
		if err := pool.SendBatch(ctx, b).Close(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	older(2)
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	after := older(1)[0]
	var rows, entries int
	var last int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ledger_rows), (SELECT count(*) FROM ledger_entries), (SELECT max(seq) FROM ledger_entries)`).Scan(&rows, &entries, &last); err != nil {
		t.Fatal(err)
	}
	if rows != 3 || entries != 3 || last != after.Seq {
		t.Fatalf("%d rows, %d entries, last seq %d; want 3, 3, %d", rows, entries, last, after.Seq)
	}
	tally, err := ledger.Verify(ctx, pool, "acme")
	if err != nil || tally.Entries != 3 || tally.BalanceMicro != balance {
		t.Fatalf("verify: %+v %v", tally, err)
	}
}
