package ledger_test

import (
	"encoding/hex"
	"testing"
	"time"

	"github.com/tokengate/tokengate/ledger"
)

// The canonical bytes and the hash of one entry with every field set
// (negative amounts, a null, money and windows), as the encoding has
// always made them: Postgres's ledger_canonical (00004, 00016) and every
// auditor's rebuild must keep agreeing with them, whatever the Go code's
// shape (TestSQLCanonicalMatchesGo checks every entry against Postgres).
func TestCanonicalBytes(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 7, 7, 0, 0, 123456000, time.UTC)
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	est, money := int64(1234567890123), int64(-42)
	e := ledger.Entry{TenantID: "acme", Seq: 9876543210, Kind: ledger.KindSettle, CreatedAt: at, AdmissionID: "adm-1",
		Model: "gpt-4o", Estimate: &est, RefillMicro: 5, DeltaMicro: -1_000_000, BalanceMicro: 999_999_999_999,
		PeriodStart: &start, PeriodUsed: 77, Late: true, Actor: "key:k1", Reason: "ü", Detail: `{"a":1}`,
		MoneyMicro: &money, Windows: "day=1,month=2"}
	const want = "19:tokengate-ledger-v14:acme10:98765432106:settle16:17966268001234565:adm-16:gpt-4o13:1234567890123~1:58:-100000012:99999999999916:17960832000000002:771:16:key:k12:ü7:{\"a\":1}2:v23:-4213:day=1,month=2"
	if got := string(ledger.Canonical(&e)); got != want {
		t.Fatalf("canonical bytes\n got %q\nwant %q", got, want)
	}
	const wantHash = "fdf082c8cec71d8620778196c246828c1e4b4375fcfc00ebcaf4b4e3875f3efe"
	if got := hex.EncodeToString(ledger.Hash([]byte("prev"), &e)); got != wantHash {
		t.Fatalf("hash %s, want %s", got, wantHash)
	}
}
