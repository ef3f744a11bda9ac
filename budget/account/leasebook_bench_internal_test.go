package account

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// BenchmarkBookingEntries is the replica's own work per admission that a
// lease's booking writes (docs/leasing.md, item 5): its entries built
// (LeasedMoves), applied to the level and chained (applyMoves: sha256 per
// entry), and the ledger insert's arrays encoded as pgx encodes them for
// the wire (the parameter types Postgres gives entry_insert.sql). No
// database: it measures the CPU a booking costs the replica, which the
// rate limit service's profile puts at about a tenth of its CPU with 64
// tenants (BENCHMARKS.md, "Quota leasing, ninth step").
//
//	go test -run '^$' -bench BookingEntries -benchmem ./budget/account/
func BenchmarkBookingEntries(b *testing.B) {
	const n = 150 // about what a renew books on bench-peer's 64 tenants
	at := time.Date(2026, 12, 7, 7, 0, 0, 0, time.UTC)
	money := int64(1234)
	adms := make([]LeasedAdmission, n)
	for i := range adms {
		adms[i] = LeasedAdmission{ID: fmt.Sprintf("adm-%020d", i), TenantID: "t01", Model: "gpt-4o-mini",
			Actor: "gateway:gw-bench", Cost: 700, MoneyMicro: &money, CreatedAt: at.Add(time.Duration(i) * time.Microsecond), Seq: int64(i + 1)}
	}
	levels := []Level{{TenantID: "t01", BalanceMicro: 1 << 40, CapacityMicro: 1 << 40}}
	m := pgtype.NewMap()
	oids := entryInsertParamOIDs()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		lv := &tenant{id: "t01"}
		lv.Tokens.BalanceMicro = 1 << 40
		var w writes
		if _, err := applyMoves(map[string]*tenant{"t01": lv}, LeasedMoves(levels, "lease-1", adms), at, &w); err != nil {
			b.Fatal(err)
		}
		bt, _ := w.batch()
		var buf []byte
		for _, q := range bt.QueuedQueries {
			if len(q.Arguments) != len(oids) {
				continue // the tenants' update: one row, not per entry
			}
			for i, a := range q.Arguments {
				var err error
				if buf, err = m.Encode(oids[i], pgtype.BinaryFormatCode, a, buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/entry")
}

// entryInsertParamOIDs are entry_insert.sql's parameter types, in order.
func entryInsertParamOIDs() []uint32 {
	t, i8, ts, b, by := uint32(pgtype.TextArrayOID), uint32(pgtype.Int8ArrayOID), uint32(pgtype.TimestamptzArrayOID), uint32(pgtype.BoolArrayOID), uint32(pgtype.ByteaArrayOID)
	return []uint32{t, i8, t, ts, t, t, i8, i8, i8, i8, i8, ts, i8, b, t, t, t, by, by, i8, t}
}

// A booked entry's detail is byte for byte what encoding/json makes of its
// struct, for lease ids that need escaping and times of every precision
// and zone.
func TestLeaseDetailAsEncodingJSON(t *testing.T) {
	t.Parallel()
	zone := time.FixedZone("x", -7*3600)
	for _, id := range []string{"lease-1", `le"ase\<&>` + "\u2028é\x01"} {
		for _, at := range []time.Time{
			time.Date(2026, 12, 7, 7, 0, 0, 0, time.UTC),
			time.Date(2026, 12, 7, 7, 0, 0, 120000000, zone),
			time.Date(1999, 1, 2, 3, 4, 5, 123456789, time.UTC),
		} {
			for _, n := range []int64{0, -5, 1 << 62} {
				want, err := json.Marshal(struct {
					Lease       string `json:"lease"`
					CostMicro   int64  `json:"cost_micro"`
					JournaledAt string `json:"journaled_at"`
				}{id, n, at.UTC().Format(time.RFC3339Nano)})
				if err != nil {
					t.Fatal(err)
				}
				if got := leaseDetail(leaseDetailPrefix(id), "cost_micro", n, "journaled_at", at); got != string(want) {
					t.Errorf("detail %s, want %s", got, want)
				}
			}
		}
	}
}
