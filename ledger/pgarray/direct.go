package pgarray

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Register makes m encode this package's types straight to Postgres's
// binary array format: the header, then each element's length and bytes,
// with no call through an interface per element. Without it pgx encodes
// them as any pgtype.ArrayGetter (the same bytes, TestSameBytesAsPgx):
// per element a reflect.TypeOf, a nil check through its driver.Valuer
// test, and a plan's Encode through an interface, about 5 % of a replica's
// CPU on the rate limit service, where a journal group sends 22 arrays.
// Every pool's connections register it (pgxpool.Config.AfterConnect:
// cmd/tokengate, integration/pgtest); a connection that does not still
// encodes them, through pgx's own array codec.
//
// It wraps the codecs of text[], bigint[], timestamptz[], bytea[] and
// boolean[]: everything but the binary encoding of this package's types
// (other values, the text format, every scan) is the wrapped codec's.
func Register(m *pgtype.Map) {
	for _, oid := range []uint32{pgtype.TextArrayOID, pgtype.Int8ArrayOID, pgtype.TimestamptzArrayOID,
		pgtype.ByteaArrayOID, pgtype.BoolArrayOID} {
		t, ok := m.TypeForOID(oid)
		if !ok {
			continue
		}
		if _, done := t.Codec.(direct); done {
			continue
		}
		m.RegisterType(&pgtype.Type{Name: t.Name, OID: oid, Codec: direct{Codec: t.Codec}})
	}
}

// direct is a registered array type's codec (Register).
type direct struct{ pgtype.Codec }

// PlanEncode returns the direct plan of one of this package's types in
// the binary format, when oid is its array type; else the wrapped codec's.
func (c direct) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if format == pgtype.BinaryFormatCode {
		var p pgtype.EncodePlan
		switch value.(type) {
		case Texts, NullTexts:
			p = planFor(oid, pgtype.TextArrayOID)
		case Int8s, NullInt8s:
			p = planFor(oid, pgtype.Int8ArrayOID)
		case Timestamptzs, NullTimestamptzs:
			p = planFor(oid, pgtype.TimestamptzArrayOID)
		case Byteas:
			p = planFor(oid, pgtype.ByteaArrayOID)
		case Bools:
			p = planFor(oid, pgtype.BoolArrayOID)
		}
		if p != nil {
			return p
		}
	}
	return c.Codec.PlanEncode(m, oid, format, value)
}

// planFor is the direct plan when the parameter's type is the value's.
func planFor(oid, want uint32) pgtype.EncodePlan {
	if oid != want {
		return nil
	}
	return directPlan{}
}

// directPlan encodes this package's types (directPlan.Encode).
type directPlan struct{}

// The element types' OIDs, as the array header names them.
const (
	textOID        = 25
	int8OID        = 20
	timestamptzOID = 1184
	byteaOID       = 17
	boolOID        = 16
)

// microsecFromUnixEpochToY2K: timestamptz counts microseconds from
// 2000-01-01 UTC.
const microsecFromUnixEpochToY2K = 946_684_800 * 1_000_000

// Encode appends value's binary array: nil (NULL) for a nil slice, as
// pgx's array codec encodes it.
func (directPlan) Encode(value any, buf []byte) ([]byte, error) {
	switch a := value.(type) {
	case Texts:
		return elems(buf, a == nil, textOID, len(a), func(b []byte, i int) ([]byte, bool) { return appendText(b, a[i]), true }), nil
	case NullTexts:
		return elems(buf, a == nil, textOID, len(a), nullable(a, appendText)), nil
	case Int8s:
		return elems(buf, a == nil, int8OID, len(a), func(b []byte, i int) ([]byte, bool) { return appendInt8(b, a[i]), true }), nil
	case NullInt8s:
		return elems(buf, a == nil, int8OID, len(a), nullable(a, appendInt8)), nil
	case Timestamptzs:
		return elems(buf, a == nil, timestamptzOID, len(a), func(b []byte, i int) ([]byte, bool) { return appendStamp(b, a[i]), true }), nil
	case NullTimestamptzs:
		return elems(buf, a == nil, timestamptzOID, len(a), nullable(a, appendStamp)), nil
	case Byteas:
		return elems(buf, a == nil, byteaOID, len(a), func(b []byte, i int) ([]byte, bool) {
			if a[i] == nil {
				return b, false
			}
			return append(binary.BigEndian.AppendUint32(b, uint32(len(a[i]))), a[i]...), true
		}), nil
	case Bools:
		return elems(buf, a == nil, boolOID, len(a), func(b []byte, i int) ([]byte, bool) {
			b = binary.BigEndian.AppendUint32(b, 1)
			if a[i] {
				return append(b, 1), true
			}
			return append(b, 0), true
		}), nil
	}
	return nil, fmt.Errorf("pgarray: cannot encode %T", value)
}

// elems appends a one-dimensional array of n elements of type elem, or
// returns nil (NULL) when isNil: put appends element i (its length and
// bytes), or reports it NULL.
func elems(buf []byte, isNil bool, elem uint32, n int, put func(b []byte, i int) ([]byte, bool)) []byte {
	if isNil {
		return nil
	}
	flag := len(buf) + 4
	buf = header(buf, elem, n)
	for i := range n {
		var ok bool
		if buf, ok = put(buf, i); !ok {
			binary.BigEndian.PutUint32(buf[flag:], 1) // the array holds a NULL
			buf = binary.BigEndian.AppendUint32(buf, 0xffffffff)
		}
	}
	return buf
}

// nullable is elems's put for a slice whose nil elements are NULL.
func nullable[T any](a []*T, put func([]byte, T) []byte) func([]byte, int) ([]byte, bool) {
	return func(b []byte, i int) ([]byte, bool) {
		if a[i] == nil {
			return b, false
		}
		return put(b, *a[i]), true
	}
}

// appendText, appendInt8 and appendStamp append an element's length and
// its binary value.
func appendText(b []byte, s string) []byte {
	return append(binary.BigEndian.AppendUint32(b, uint32(len(s))), s...)
}

func appendInt8(b []byte, n int64) []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(b, 8), uint64(n))
}

func appendStamp(b []byte, t time.Time) []byte {
	return appendInt8(b, t.Unix()*1_000_000+int64(t.Nanosecond())/1000-microsecFromUnixEpochToY2K)
}

// header appends a one-dimensional array's header of n elements of elem
// (lower bound 1), without NULLs (elems sets the flag).
func header(buf []byte, elem uint32, n int) []byte {
	buf = binary.BigEndian.AppendUint32(buf, 1) // dimensions
	buf = binary.BigEndian.AppendUint32(buf, 0) // contains a NULL
	buf = binary.BigEndian.AppendUint32(buf, elem)
	buf = binary.BigEndian.AppendUint32(buf, uint32(n))
	return binary.BigEndian.AppendUint32(buf, 1) // lower bound
}

// Configure registers the direct plans (Register) on every connection of
// a pool opened with cfg, after cfg's own AfterConnect.
func Configure(cfg *pgxpool.Config) {
	next := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		Register(c.TypeMap())
		if next != nil {
			return next(ctx, c)
		}
		return nil
	}
}
