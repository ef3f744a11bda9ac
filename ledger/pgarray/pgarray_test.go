package pgarray_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tokengate/tokengate/ledger/pgarray"
)

// Each type encodes, in both formats, to the bytes pgx makes of the plain
// slice it wraps: NULL elements, empty and nil slices, and values of every
// size included.
func TestSameBytesAsPgx(t *testing.T) {
	t.Parallel()
	m := pgtype.NewMap()
	rng := rand.New(rand.NewPCG(7, 39))
	str := func() string { return fmt.Sprintf("s%d\"\\{é,}", rng.Int64()) }
	num := func() int64 { return rng.Int64() - rng.Int64() }
	at := func() time.Time { return time.Unix(rng.Int64N(1<<34), rng.Int64N(1e9)).In(time.FixedZone("z", 3600)) }
	for _, n := range []int{-1, 0, 1, 7} { // -1: a nil slice
		var (
			texts     []string
			nullTexts []*string
			int8s     []int64
			nullInt8s []*int64
			times     []time.Time
			nullTimes []*time.Time
			byteas    [][]byte
		)
		if n >= 0 {
			texts, nullTexts, int8s, nullInt8s = []string{}, []*string{}, []int64{}, []*int64{}
			times, nullTimes, byteas = []time.Time{}, []*time.Time{}, [][]byte{}
		}
		for i := range max(n, 0) {
			s, v, ts := str(), num(), at()
			texts, int8s, times = append(texts, s), append(int8s, v), append(times, ts)
			if i%3 == 1 {
				nullTexts, nullInt8s, nullTimes, byteas = append(nullTexts, nil), append(nullInt8s, nil), append(nullTimes, nil), append(byteas, nil)
			} else {
				nullTexts, nullInt8s, nullTimes, byteas = append(nullTexts, &s), append(nullInt8s, &v), append(nullTimes, &ts), append(byteas, []byte(s))
			}
		}
		for _, c := range []struct {
			name      string
			oid       uint32
			ours, pgx any
		}{
			{"Texts", pgtype.TextArrayOID, pgarray.Texts(texts), texts},
			{"NullTexts", pgtype.TextArrayOID, pgarray.NullTexts(nullTexts), nullTexts},
			{"Int8s", pgtype.Int8ArrayOID, pgarray.Int8s(int8s), int8s},
			{"NullInt8s", pgtype.Int8ArrayOID, pgarray.NullInt8s(nullInt8s), nullInt8s},
			{"Timestamptzs", pgtype.TimestamptzArrayOID, pgarray.Timestamptzs(times), times},
			{"NullTimestamptzs", pgtype.TimestamptzArrayOID, pgarray.NullTimestamptzs(nullTimes), nullTimes},
			{"Byteas", pgtype.ByteaArrayOID, pgarray.Byteas(byteas), byteas},
		} {
			for _, format := range []int16{pgtype.BinaryFormatCode, pgtype.TextFormatCode} {
				want, err := m.Encode(c.oid, format, c.pgx, nil)
				if err != nil {
					t.Fatalf("%s, %d elements, format %d: pgx: %v", c.name, n, format, err)
				}
				got, err := m.Encode(c.oid, format, c.ours, nil)
				if err != nil {
					t.Fatalf("%s, %d elements, format %d: %v", c.name, n, format, err)
				}
				if !bytes.Equal(got, want) || (got == nil) != (want == nil) {
					t.Errorf("%s, %d elements, format %d:\n got %x\nwant %x", c.name, n, format, got, want)
				}
			}
		}
	}
}

// BenchmarkEncode is one 150-element nullable bigint[] and text[], pgx's
// plain slices against this package's.
func BenchmarkEncode(b *testing.B) {
	m := pgtype.NewMap()
	ints, strs := make([]*int64, 150), make([]*string, 150)
	for i := range ints {
		v, s := int64(i*1000), fmt.Sprint(i)
		ints[i], strs[i] = &v, &s
	}
	for _, c := range []struct {
		name       string
		ints, strs any
	}{{"pgx", ints, strs}, {"pgarray", pgarray.NullInt8s(ints), pgarray.NullTexts(strs)}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var buf []byte
			for range b.N {
				var err error
				if buf, err = m.Encode(pgtype.Int8ArrayOID, pgtype.BinaryFormatCode, c.ints, buf[:0]); err != nil {
					b.Fatal(err)
				}
				if buf, err = m.Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, c.strs, buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
