// Package pgarray passes Go slices as Postgres array parameters through pgx
// without reflection and without an allocation per element.
//
// Every decision, journal group and booking writes its rows as one array
// per column (INSERT .. SELECT FROM unnest(..)): a booking's ledger insert
// is 21 arrays of one element per entry. pgx encodes a []*string, []*int64,
// []*time.Time or [][]byte through reflection, and every element of those,
// and of []string, []int64 and []time.Time, through an interface that
// allocates; on the rate limit service that was a quarter of a booking's
// CPU (BenchmarkBookingEntries). The types here are those slices, each
// element handed to pgx as a pointer to a type that gives its value
// directly (pgtype's TextValuer, Int64Valuer, TimestamptzValuer,
// BytesValuer): the same bytes on the wire (TestSameBytesAsPgx), with
// nothing allocated but the buffer.
//
// It lives below ledger, the leaf that every package writing rows
// imports.
package pgarray

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Texts is a text[] parameter.
type Texts []string

// NullTexts is a text[] parameter; a nil element is NULL.
type NullTexts []*string

// Int8s is a bigint[] parameter.
type Int8s []int64

// NullInt8s is a bigint[] parameter; a nil element is NULL.
type NullInt8s []*int64

// Timestamptzs is a timestamptz[] parameter.
type Timestamptzs []time.Time

// NullTimestamptzs is a timestamptz[] parameter; a nil element is NULL.
type NullTimestamptzs []*time.Time

// Byteas is a bytea[] parameter; a nil element is NULL (as pgx encodes a
// nil []byte).
type Byteas [][]byte

// dims is a one-dimensional array of n elements, or nil (a NULL array) for
// a nil slice, as pgtype.FlatArray has it.
func dims(isNil bool, n int) []pgtype.ArrayDimension {
	if isNil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(n), LowerBound: 1}}
}

type text string

func (t *text) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*t), Valid: true}, nil
}

type bigint int64

func (n *bigint) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: int64(*n), Valid: true}, nil
}

type timestamptz time.Time

func (t *timestamptz) TimestamptzValue() (pgtype.Timestamptz, error) {
	return pgtype.Timestamptz{Time: time.Time(*t), Valid: true}, nil
}

type bytea []byte

func (b *bytea) BytesValue() ([]byte, error) { return []byte(*b), nil }

// Dimensions, Index and IndexType make each type a pgtype.ArrayGetter.
// Index returns a pointer (boxed without an allocation), or an untyped nil
// for NULL.

func (a Texts) Dimensions() []pgtype.ArrayDimension { return dims(a == nil, len(a)) }
func (a Texts) Index(i int) any                     { return (*text)(&a[i]) }
func (a Texts) IndexType() any                      { return (*text)(nil) }

func (a NullTexts) Dimensions() []pgtype.ArrayDimension { return dims(a == nil, len(a)) }
func (a NullTexts) Index(i int) any {
	if a[i] == nil {
		return nil
	}
	return (*text)(a[i])
}
func (a NullTexts) IndexType() any { return (*text)(nil) }

func (a Int8s) Dimensions() []pgtype.ArrayDimension { return dims(a == nil, len(a)) }
func (a Int8s) Index(i int) any                     { return (*bigint)(&a[i]) }
func (a Int8s) IndexType() any                      { return (*bigint)(nil) }

func (a NullInt8s) Dimensions() []pgtype.ArrayDimension { return dims(a == nil, len(a)) }
func (a NullInt8s) Index(i int) any {
	if a[i] == nil {
		return nil
	}
	return (*bigint)(a[i])
}
func (a NullInt8s) IndexType() any { return (*bigint)(nil) }

func (a Timestamptzs) Dimensions() []pgtype.ArrayDimension { return dims(a == nil, len(a)) }
func (a Timestamptzs) Index(i int) any                     { return (*timestamptz)(&a[i]) }
func (a Timestamptzs) IndexType() any                      { return (*timestamptz)(nil) }

func (a NullTimestamptzs) Dimensions() []pgtype.ArrayDimension { return dims(a == nil, len(a)) }
func (a NullTimestamptzs) Index(i int) any {
	if a[i] == nil {
		return nil
	}
	return (*timestamptz)(a[i])
}
func (a NullTimestamptzs) IndexType() any { return (*timestamptz)(nil) }

func (a Byteas) Dimensions() []pgtype.ArrayDimension { return dims(a == nil, len(a)) }
func (a Byteas) Index(i int) any {
	if a[i] == nil {
		return nil
	}
	return (*bytea)(&a[i])
}
func (a Byteas) IndexType() any { return (*bytea)(nil) }

// Bools is a boolean[] parameter.
type Bools []bool

type boolean bool

func (b *boolean) BoolValue() (pgtype.Bool, error) {
	return pgtype.Bool{Bool: bool(*b), Valid: true}, nil
}

func (a Bools) Dimensions() []pgtype.ArrayDimension { return dims(a == nil, len(a)) }
func (a Bools) Index(i int) any                     { return (*boolean)(&a[i]) }
func (a Bools) IndexType() any                      { return (*boolean)(nil) }
