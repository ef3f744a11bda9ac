package account_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// golden compares got with testdata/name, or writes it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(want)) {
		t.Fatalf("the stored form changed: it is an on-disk format (rows already stored must still read).\ngot:  %s\nwant: %s", got, want)
	}
}

// TestStoredReservationFormat pins the stored form of an admission (what an
// Idempotency-Key returns for 24 h), and reads back a response stored by
// the release before it had its own type.
func TestStoredReservationFormat(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 3, 10, 0, 0, 123456000, time.UTC)
	start, end := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	r := &account.Reservation{
		AdmissionID: "adm_06h3e0000000000000000000ab",
		Estimate: estimator.Estimate{Model: "gpt-4o-2024-08-06", Family: "gpt-4o", InputTokens: 9, OutputTokens: 100, Cost: 109,
			Approximate: true, InputWeightMicro: 1_000_000, OutputWeightMicro: 4_000_000},
		CreatedAt: at, ExpiresAt: at.Add(10 * time.Minute),
		Snapshot: rule.Snapshot{TenantID: "acme", At: at, TokensMicro: 99_891_000_000, TokensFullIn: 109 * time.Millisecond,
			RequestsMicro: 599_000_000, RequestsFullIn: 100 * time.Millisecond, OpenReservations: 3,
			PeriodStart: start, PeriodEnd: end, PeriodUsed: 109, LedgerSeq: 42,
			Limits: rule.Limits{TokensCapacity: 100_000, TokensRateMicro: 1_000_000_000, RequestsCapacity: 600, RequestsRateMicro: 10_000_000,
				MaxConcurrent: 64, PeriodBudget: 50_000_000, Period: rule.PeriodMonth, ReservationTTL: 10 * time.Minute,
				MaxWait: 30 * time.Second, OnStoreUnavailable: rule.PolicyLocal}},
	}
	b, err := account.EncodeReservation(r)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "stored_reservation.json", b)
	back, err := account.DecodeReservation(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, r) {
		t.Fatalf("read back differs:\n%+v\n%+v", back, r)
	}
	// Written by the first release (json.Marshal of Reservation, with the
	// estimate's failure policy in it): still read, the policy ignored.
	old, err := os.ReadFile(filepath.Join("testdata", "stored_reservation_v1.json"))
	if err != nil {
		t.Fatal(err)
	}
	v1, err := account.DecodeReservation(old)
	if err != nil || v1.AdmissionID != r.AdmissionID || v1.Estimate != r.Estimate || !sameStoredLimits(v1.Snapshot.Limits, r.Snapshot.Limits) || !v1.ExpiresAt.Equal(r.ExpiresAt) {
		t.Fatalf("a response stored by the first release: %+v %v", v1, err)
	}
}

// sameStoredLimits compares limits as a stored reservation keeps them: the
// windows are not repeated in it (its period fields are).
func sameStoredLimits(a, b rule.Limits) bool {
	a.Windows, b.Windows = nil, nil
	return reflect.DeepEqual(a, b)
}
