package pgarray_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tokengate/tokengate/ledger/pgarray"
)

// Each type encodes, in both formats, to the bytes pgx makes of the plain
// slice it wraps: NULL elements, empty and nil slices, and values of every
// size included; through pgx's array codec and through the direct plans
// of a map Register was called on (which also encodes the plain slices as
// pgx does, and scans what it encoded back to the values).
func TestSameBytesAsPgx(t *testing.T) {
	t.Parallel()
	m, reg := pgtype.NewMap(), pgtype.NewMap()
	pgarray.Register(reg)
	pgarray.Register(reg) // twice wraps once
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
			bools     []bool
		)
		if n >= 0 {
			texts, nullTexts, int8s, nullInt8s = []string{}, []*string{}, []int64{}, []*int64{}
			times, nullTimes, byteas, bools = []time.Time{}, []*time.Time{}, [][]byte{}, []bool{}
		}
		for i := range max(n, 0) {
			s, v, ts := str(), num(), at()
			texts, int8s, times, bools = append(texts, s), append(int8s, v), append(times, ts), append(bools, v%2 == 0)
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
			{"Bools", pgtype.BoolArrayOID, pgarray.Bools(bools), bools},
		} {
			for _, format := range []int16{pgtype.BinaryFormatCode, pgtype.TextFormatCode} {
				want, err := m.Encode(c.oid, format, c.pgx, nil)
				if err != nil {
					t.Fatalf("%s, %d elements, format %d: pgx: %v", c.name, n, format, err)
				}
				for _, e := range []struct {
					how   string
					m     *pgtype.Map
					value any
				}{{"pgx's array codec", m, c.ours}, {"registered", reg, c.ours}, {"registered, the plain slice", reg, c.pgx}} {
					got, err := e.m.Encode(c.oid, format, e.value, []byte("prefix"))
					if err != nil {
						t.Fatalf("%s, %d elements, format %d, %s: %v", c.name, n, format, e.how, err)
					}
					if want == nil && got != nil || want != nil && !bytes.Equal(got, append([]byte("prefix"), want...)) {
						t.Errorf("%s, %d elements, format %d, %s:\n got %x\nwant prefix and %x", c.name, n, format, e.how, got, want)
					}
				}
			}
			if n < 0 {
				continue
			}
			enc, err := reg.Encode(c.oid, pgtype.BinaryFormatCode, c.ours, nil)
			if err != nil {
				t.Fatal(err)
			}
			back := reflect.New(reflect.TypeOf(c.pgx))
			if err := reg.Scan(c.oid, pgtype.BinaryFormatCode, enc, back.Interface()); err != nil {
				t.Fatalf("%s, %d elements: scan: %v", c.name, n, err)
			}
			again, err := m.Encode(c.oid, pgtype.BinaryFormatCode, back.Elem().Interface(), nil)
			if err != nil || !bytes.Equal(again, enc) {
				t.Errorf("%s, %d elements: scanned back to %v (%v), which encodes to %x, not %x", c.name, n, back.Elem().Interface(), err, again, enc)
			}
		}
	}
}

// BenchmarkEncode is one 150-element nullable bigint[] and text[], pgx's
// plain slices against this package's, through pgx's array codec and
// registered (Register).
func BenchmarkEncode(b *testing.B) {
	m, reg := pgtype.NewMap(), pgtype.NewMap()
	pgarray.Register(reg)
	ints, strs := make([]*int64, 150), make([]*string, 150)
	for i := range ints {
		v, s := int64(i*1000), fmt.Sprint(i)
		ints[i], strs[i] = &v, &s
	}
	for _, c := range []struct {
		name       string
		ints, strs any
		m          *pgtype.Map
	}{{"pgx", ints, strs, m}, {"pgarray", pgarray.NullInt8s(ints), pgarray.NullTexts(strs), m}, {"pgarray-registered", pgarray.NullInt8s(ints), pgarray.NullTexts(strs), reg}} {
		m := c.m
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
