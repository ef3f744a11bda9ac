package ledger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
)

// ErrBroken is wrapped by every Problem: the chain or its arithmetic does not
// hold.
var ErrBroken = errors.New("ledger: chain broken")

// Problem names the first entry at which a tenant's ledger stops being
// consistent.
type Problem struct {
	TenantID string
	Seq      int64
	Reason   string
}

func (p *Problem) Error() string {
	return fmt.Sprintf("ledger: tenant %s entry %d: %s", p.TenantID, p.Seq, p.Reason)
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
	return VerifyFrom(ctx, q, tenantID, Tally{})
}

// VerifyFrom continues a verification from a tally an earlier Verify or
// VerifyFrom returned: it checks only the entries after from.LastSeq, so a
// periodic watch costs what was appended since its last run.
func VerifyFrom(ctx context.Context, q Querier, tenantID string, from Tally) (Tally, error) {
	t := from
	prev := t.LastHash
	if prev == nil {
		prev = []byte{}
	}
	const page = 5000
	for {
		entries, err := EntryList(ctx, q, tenantID, t.LastSeq, page)
		if err != nil {
			return t, err
		}
		for i := range entries {
			e := &entries[i]
			if e.Seq != t.LastSeq+1 {
				return t, &Problem{tenantID, t.LastSeq + 1, fmt.Sprintf("missing: the next entry has seq %d", e.Seq)}
			}
			if !bytes.Equal(e.PrevHash, prev) {
				return t, &Problem{tenantID, e.Seq, "prev_hash does not match the previous entry's hash"}
			}
			if want := Hash(prev, e); !bytes.Equal(want, e.Hash) {
				return t, &Problem{tenantID, e.Seq, "hash does not match the entry's contents"}
			}
			want := t.BalanceMicro + e.RefillMicro + e.DeltaMicro
			if e.BalanceMicro != want {
				return t, &Problem{tenantID, e.Seq, fmt.Sprintf("balance %d, but previous balance + refill + delta = %d", e.BalanceMicro, want)}
			}
			t.BalanceMicro = e.BalanceMicro
			t.PeriodUsed = e.PeriodUsed
			t.LastSeq = e.Seq
			t.LastHash = e.Hash
			t.Entries++
			prev = e.Hash
		}
		if len(entries) < page {
			return t, nil
		}
	}
}
