package ledger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/big"
)

// ErrBroken is wrapped by every Problem: the chain or its arithmetic does not
// hold.
var ErrBroken = errors.New("ledger: chain broken")

// ProblemKind classifies a Problem, so that a reader (the CLI, the invariant
// watch's alerts, a monitoring script) can tell tampering from a wrapped sum.
type ProblemKind string

// The kinds of problems Verify finds.
const (
	// ProblemChain: an entry is missing, or a hash does not match.
	ProblemChain ProblemKind = "chain"
	// ProblemArithmetic: an entry's balance is not the previous balance
	// plus its refill and delta.
	ProblemArithmetic ProblemKind = "arithmetic"
	// ProblemOverflow: an entry's exact arithmetic leaves int64, so the
	// balance the store wrote had wrapped around (or a count went
	// negative). Verify computes in more bits than the store, so a wrapped
	// balance cannot match by wrapping the same way.
	ProblemOverflow ProblemKind = "overflow"
)

// Problem names the first entry at which a tenant's ledger stops being
// consistent.
type Problem struct {
	TenantID string
	Seq      int64
	Kind     ProblemKind
	Reason   string
}

func (p *Problem) Error() string {
	return fmt.Sprintf("ledger: tenant %s entry %d: %s: %s", p.TenantID, p.Seq, p.Kind, p.Reason)
}

// Unwrap makes errors.Is(p, ErrBroken) true.
func (p *Problem) Unwrap() error { return ErrBroken }

// Tally is what Verify recomputed from a tenant's entries.
type Tally struct {
	Entries      int64
	LastSeq      int64
	LastHash     []byte
	BalanceMicro int64 // recomputed: the sum of every refill and delta
	PeriodUsed   int64 // as of the last entry
}

// Verify walks a tenant's entries from the first and recomputes the hash
// chain and the balance arithmetic. It returns a *Problem (wrapping
// ErrBroken) naming the first entry that does not hold.
func Verify(ctx context.Context, q Querier, tenantID string) (Tally, error) {
	return VerifyFrom(ctx, q, tenantID, Tally{}, 0)
}

// VerifyFrom continues a verification from a tally an earlier Verify or
// VerifyFrom returned: it checks only the entries after from.LastSeq, so a
// periodic watch costs what was appended since its last run. A positive
// upTo stops it at that entry (a head read before: entries appended since
// are left to the next run); 0 reads to the chain's end.
//
// Each page is a statement of its own, so q may be a pool: entries are
// never rewritten, so pages read at different moments read one chain.
// Only a comparison with a tenant row needs the row read first, and upTo
// set to its head (account.Watch).
func VerifyFrom(ctx context.Context, q Querier, tenantID string, from Tally, upTo int64) (Tally, error) {
	t := from
	prev := t.LastHash
	if prev == nil {
		prev = []byte{}
	}
	const page = 5000
	for upTo <= 0 || t.LastSeq < upTo {
		entries, err := EntryList(ctx, q, tenantID, t.LastSeq, page)
		if err != nil {
			return t, err
		}
		if len(entries) == 0 {
			return t, nil
		}
		for i := range entries {
			e := &entries[i]
			if upTo > 0 && t.LastSeq >= upTo {
				return t, nil
			}
			if e.Seq != t.LastSeq+1 {
				return t, &Problem{tenantID, t.LastSeq + 1, ProblemChain, fmt.Sprintf("missing: the next entry has seq %d", e.Seq)}
			}
			if !bytes.Equal(e.PrevHash, prev) {
				return t, &Problem{tenantID, e.Seq, ProblemChain, "prev_hash does not match the previous entry's hash"}
			}
			if want := Hash(prev, e); !bytes.Equal(want, e.Hash) {
				return t, &Problem{tenantID, e.Seq, ProblemChain, "hash does not match the entry's contents"}
			}
			if p := checkArithmetic(tenantID, t.BalanceMicro, e); p != nil {
				return t, p
			}
			t.BalanceMicro = e.BalanceMicro
			t.PeriodUsed = e.PeriodUsed
			t.LastSeq = e.Seq
			t.LastHash = e.Hash
			t.Entries++
			prev = e.Hash
		}
	}
	return t, nil
}

// checkArithmetic recomputes balance + refill + delta exactly, in a big
// integer: a sum that leaves int64 is an overflow (the store wrapped it),
// whatever the stored balance says; one that fits must equal it.
func checkArithmetic(tenantID string, balance int64, e *Entry) *Problem {
	want := new(big.Int).SetInt64(balance)
	want.Add(want, big.NewInt(e.RefillMicro))
	want.Add(want, big.NewInt(e.DeltaMicro))
	if !want.IsInt64() {
		return &Problem{tenantID, e.Seq, ProblemOverflow, fmt.Sprintf(
			"previous balance %d + refill %d + delta %d = %s micro-tokens, beyond the int64 range: the stored balance %d wrapped around",
			balance, e.RefillMicro, e.DeltaMicro, want, e.BalanceMicro)}
	}
	if w := want.Int64(); e.BalanceMicro != w {
		return &Problem{tenantID, e.Seq, ProblemArithmetic, fmt.Sprintf("balance %d, but previous balance + refill + delta = %d", e.BalanceMicro, w)}
	}
	if e.PeriodUsed < 0 {
		return &Problem{tenantID, e.Seq, ProblemOverflow, fmt.Sprintf("period_used is %d: a count of spent cost cannot be negative, its sum wrapped around", e.PeriodUsed)}
	}
	return nil
}
