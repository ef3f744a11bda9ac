package ledger

import (
	"crypto/sha256"
	"strconv"
	"time"
)

// Kind names what changed.
type Kind string

// The kinds of entries.
const (
	KindReserve Kind = "reserve"
	KindSettle  Kind = "settle"
	KindRelease Kind = "release"
	KindExpire  Kind = "expire"
	KindAdjust  Kind = "adjust"
	KindLimits  Kind = "limits"
	KindTenant  Kind = "tenant"
	// A batch's story (budget/batch), its entries' AdmissionID the batch's
	// id: the whole batch reserved against the enqueued-tokens allowance,
	// its lines with usage settled, and its failed, expired or cancelled
	// lines refunded. They move the allowance, never the token balance.
	KindBatchReserve Kind = "batch_reserve"
	KindBatchSettle  Kind = "batch_settle"
	KindBatchRefund  Kind = "batch_refund"
	// A lease's story (budget/lease), its entries' AdmissionID the lease's
	// id: the slice pre-debited at one level, and what was not used of it,
	// refunded by a return or at expiry. An admission made from a lease is
	// a KindReserve entry whose delta is zero (the take already debited).
	KindLeaseTake   Kind = "lease_take"
	KindLeaseReturn Kind = "lease_return"
)

// Entry is one ledger row. Amounts of the token balance are micro-tokens.
type Entry struct {
	TenantID    string
	Seq         int64
	Kind        Kind
	CreatedAt   time.Time // database time, taken while the tenant row was locked
	AdmissionID string    // "" when the entry concerns no admission
	Model       string
	Estimate    *int64 // estimated cost, in cost units
	Actual      *int64 // actual cost, in cost units
	// RefillMicro is what refill added just before this change; DeltaMicro
	// is the change itself, after the capacity cap; BalanceMicro the result.
	RefillMicro  int64
	DeltaMicro   int64
	BalanceMicro int64
	PeriodStart  *time.Time // start of the period budget's current window
	PeriodUsed   int64      // spent in that window, after this change
	Late         bool       // a settle or release that arrived after expiry
	Actor        string
	Reason       string
	Detail       string // JSON describing the change (limits before/after, ...)
	// MoneyMicro is the money the entry moved, in micro-units of the
	// deployment's currency (the estimate's at reserve, actual - estimate
	// at settle, - estimate at release), at the price the admission was
	// reserved at; nil when the entry concerns no priced admission.
	MoneyMicro *int64
	// Windows is every window's usage after the change, "name=used,..."
	// in the tenant's window order ("" for a tenant without windows).
	Windows  string
	PrevHash []byte
	Hash     []byte
	// Lease is where the entry may be stored with others, not part of it
	// (neither hashed nor read back): the lease whose booking wrote it.
	// The entries of one tenant that one booking of a lease writes share
	// their created_at, delta, balance, period and windows, so
	// QueueInsert stores a run of them as one row (a record), found
	// through the lease (Filter.Lease) instead of an index entry each.
	Lease string
}

// Head is the end of a tenant's chain: the last sequence number and hash.
// The tenant row stores it so that an append needs no extra read.
type Head struct {
	Seq  int64
	Hash []byte
}

// Seal numbers e as the entry after h, links and hashes it, and returns the
// new head.
func (h Head) Seal(e *Entry) Head {
	e.Seq = h.Seq + 1
	e.PrevHash = h.Hash
	if e.PrevHash == nil {
		e.PrevHash = []byte{}
	}
	e.Hash = Hash(e.PrevHash, e)
	return Head{Seq: e.Seq, Hash: e.Hash}
}

// Hash is sha256(prev || Canonical(e)). It hashes one buffer that holds
// both, with no allocation but the sum's: every ledger entry of every
// decision and booking is hashed on the replica's hot path.
func Hash(prev []byte, e *Entry) []byte {
	var scratch [512]byte
	buf := appendCanonical(append(scratch[:0], prev...), e)
	sum := sha256.Sum256(buf)
	return sum[:]
}

// canonicalVersion prefixes the encoding so a future format cannot collide.
const canonicalVersion = "tokengate-ledger-v1"

// Canonical is the byte encoding the hash covers: every field but the hashes,
// in a fixed order, each length-prefixed ("<len>:<bytes>") so no two entries
// encode alike; a null is "~". Times are microseconds since the Unix epoch,
// the precision Postgres stores. An auditor can rebuild it in any language.
func Canonical(e *Entry) []byte {
	return appendCanonical(make([]byte, 0, 256), e)
}

// appendCanonical appends Canonical(e) to b. Numbers are formatted into a
// buffer on the stack, not as strings, so that the encoding allocates only
// when b must grow.
func appendCanonical(b []byte, e *Entry) []byte {
	field := func(s string) {
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, ':')
		b = append(b, s...)
	}
	num := func(n int64) {
		var d [20]byte
		digits := strconv.AppendInt(d[:0], n, 10)
		b = strconv.AppendInt(b, int64(len(digits)), 10)
		b = append(b, ':')
		b = append(b, digits...)
	}
	optNum := func(n *int64) {
		if n == nil {
			b = append(b, '~')
			return
		}
		num(*n)
	}
	optTime := func(t *time.Time) {
		if t == nil {
			b = append(b, '~')
			return
		}
		num(t.UnixMicro())
	}
	field(canonicalVersion)
	field(e.TenantID)
	num(e.Seq)
	field(string(e.Kind))
	num(e.CreatedAt.UnixMicro())
	field(e.AdmissionID)
	field(e.Model)
	optNum(e.Estimate)
	optNum(e.Actual)
	num(e.RefillMicro)
	num(e.DeltaMicro)
	num(e.BalanceMicro)
	optTime(e.PeriodStart)
	num(e.PeriodUsed)
	if e.Late {
		field("1")
	} else {
		field("0")
	}
	field(e.Actor)
	field(e.Reason)
	field(e.Detail)
	// Entries before money and windows (both unset) encode as they always
	// did, so their hashes still verify; a later entry appends both, behind
	// a marker, and its hash covers them.
	if e.MoneyMicro != nil || e.Windows != "" {
		field("v2")
		optNum(e.MoneyMicro)
		if e.Windows == "" {
			b = append(b, '~')
		} else {
			field(e.Windows)
		}
	}
	return b
}
