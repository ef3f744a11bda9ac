package account

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tokengate/tokengate/budget/rule"
)

// Total is an exact integer sum of a report: a count of tokens, cost units
// or micro-tokens over many admissions, which may exceed int64 even though
// each term fits. The reports compute it in Postgres numeric and scan it
// here; it marshals as a plain JSON number of any length (a client should
// decode it without rounding, e.g. json.Number or a big integer). The zero
// value is 0. A Total is never changed after it is made.
type Total struct {
	n *big.Int // nil is 0
}

// NewTotal makes a Total of n.
func NewTotal(n int64) Total { return Total{n: big.NewInt(n)} }

// TotalOf makes a Total of a copy of n.
func TotalOf(n *big.Int) Total { return Total{n: new(big.Int).Set(n)} }

// Big returns the total as a new big.Int.
func (t Total) Big() *big.Int {
	if t.n == nil {
		return new(big.Int)
	}
	return new(big.Int).Set(t.n)
}

// Int64 returns the total and whether it fits an int64.
func (t Total) Int64() (int64, bool) {
	if t.n == nil {
		return 0, true
	}
	return t.n.Int64(), t.n.IsInt64()
}

// Float64 is the nearest float64, for geometry such as a chart's bars.
func (t Total) Float64() float64 {
	if t.n == nil {
		return 0
	}
	f, _ := new(big.Float).SetInt(t.n).Float64()
	return f
}

// Sign is -1, 0 or +1.
func (t Total) Sign() int {
	if t.n == nil {
		return 0
	}
	return t.n.Sign()
}

// Cmp compares t and u: -1, 0 or +1.
func (t Total) Cmp(u Total) int { return t.Big().Cmp(u.Big()) }

// Add returns t + u.
func (t Total) Add(u Total) Total { return Total{n: new(big.Int).Add(t.Big(), u.Big())} }

// AddInt64 returns t + n.
func (t Total) AddInt64(n int64) Total { return Total{n: new(big.Int).Add(t.Big(), big.NewInt(n))} }

// String is the decimal digits, with a leading "-" when negative.
func (t Total) String() string { return t.Big().String() }

// Tokens renders a total of micro-tokens as an exact decimal of tokens,
// like ledger.Tokens.
func (t Total) Tokens() string {
	q, r := new(big.Int).QuoRem(t.Big(), big.NewInt(rule.Micro), new(big.Int))
	sign := ""
	if t.Sign() < 0 {
		sign = "-"
		q.Neg(q)
		r.Neg(r)
	}
	s := sign + q.String()
	if r.Sign() != 0 {
		s += "." + strings.TrimRight(fmt.Sprintf("%06d", r.Int64()), "0")
	}
	return s
}

// MarshalJSON writes the total as a JSON number, every digit of it.
func (t Total) MarshalJSON() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalJSON reads a JSON integer of any length.
func (t *Total) UnmarshalJSON(b []byte) error {
	var num json.Number
	if err := json.Unmarshal(b, &num); err != nil {
		return fmt.Errorf("budget: total: %w", err)
	}
	n, ok := new(big.Int).SetString(num.String(), 10)
	if !ok {
		return fmt.Errorf("budget: total: %s is not an integer", num)
	}
	t.n = n
	return nil
}

// errTotalNotInteger: a numeric that is NULL, NaN, infinite or fractional
// is not a sum of integers.
var errTotalNotInteger = errors.New("budget: total: not an integer")

// ScanNumeric reads a Postgres numeric (pgtype.NumericScanner), so pgx
// scans a numeric column straight into a Total.
func (t *Total) ScanNumeric(v pgtype.Numeric) error {
	if !v.Valid || v.NaN || v.InfinityModifier != pgtype.Finite || v.Int == nil {
		return errTotalNotInteger
	}
	n := new(big.Int).Set(v.Int)
	if v.Exp > 0 {
		n.Mul(n, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(v.Exp)), nil))
	} else if v.Exp < 0 {
		div := new(big.Int).Exp(big.NewInt(10), big.NewInt(-int64(v.Exp)), nil)
		if new(big.Int).Rem(n, div).Sign() != 0 {
			return errTotalNotInteger
		}
		n.Quo(n, div)
	}
	t.n = n
	return nil
}
