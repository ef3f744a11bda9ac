package account

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// reflectEncode is the stored form as encoding/json writes it: what
// EncodeReservation's hand-written bytes must equal.
func reflectEncode(r *Reservation) ([]byte, error) {
	s, l := r.Snapshot, r.Snapshot.Limits
	return json.Marshal(storedReservation{
		AdmissionID: r.AdmissionID, Estimate: StoreEstimate(r.Estimate), CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt,
		Snapshot: storedSnapshot{TenantID: s.TenantID, At: s.At, Disabled: s.Disabled, TokensMicro: s.TokensMicro,
			TokensFullIn: s.TokensFullIn, RequestsMicro: s.RequestsMicro, RequestsFullIn: s.RequestsFullIn,
			OpenReservations: s.OpenReservations, PeriodStart: s.PeriodStart, PeriodEnd: s.PeriodEnd, PeriodUsed: s.PeriodUsed,
			LedgerSeq: s.LedgerSeq,
			Limits: storedLimits{TokensCapacity: l.TokensCapacity, TokensRateMicro: l.TokensRateMicro,
				RequestsCapacity: l.RequestsCapacity, RequestsRateMicro: l.RequestsRateMicro, MaxConcurrent: l.MaxConcurrent,
				PeriodBudget: l.PeriodBudget, Period: string(l.Period), ReservationTTL: l.ReservationTTL, MaxWait: l.MaxWait,
				OnStoreUnavailable: string(l.OnStoreUnavailable)}},
	})
}

// randomReservation draws every field, strings included from an alphabet
// with each character encoding/json escapes.
func randomReservation(rng *rand.Rand) *Reservation {
	str := func() string {
		const alphabet = "abcXYZ019-_./:@ \"\\<>&\n\t\x00\x1f\x7fé€\u2028\xff"
		rs := []rune(alphabet)
		b := []byte{}
		for range rng.IntN(12) {
			if rng.IntN(8) == 0 {
				b = append(b, 0xff) // invalid UTF-8
				continue
			}
			b = append(b, string(rs[rng.IntN(len(rs))])...)
		}
		return string(b)
	}
	i64 := func() int64 {
		switch rng.IntN(4) {
		case 0:
			return 0
		case 1:
			return -rng.Int64()
		}
		return rng.Int64N(1 << uint(rng.IntN(62)+1))
	}
	tm := func() time.Time {
		t := time.Unix(rng.Int64N(253402300799), rng.Int64N(1e9))
		if rng.IntN(2) == 0 {
			return t.UTC()
		}
		return t.In(time.FixedZone("x", (rng.IntN(48)-24)*1800))
	}
	return &Reservation{
		AdmissionID: str(),
		Estimate: estimator.Estimate{Model: str(), Family: str(), InputTokens: i64(), OutputTokens: i64(), Cost: i64(),
			Approximate: rng.IntN(2) == 0, InputWeightMicro: i64(), OutputWeightMicro: i64()},
		CreatedAt: tm(), ExpiresAt: tm(),
		Snapshot: rule.Snapshot{TenantID: str(), At: tm(), Disabled: rng.IntN(2) == 0, TokensMicro: i64(),
			TokensFullIn: time.Duration(i64()), RequestsMicro: i64(), RequestsFullIn: time.Duration(i64()),
			OpenReservations: i64(), PeriodStart: tm(), PeriodEnd: tm(), PeriodUsed: i64(), LedgerSeq: i64(),
			Limits: rule.Limits{TokensCapacity: i64(), TokensRateMicro: i64(), RequestsCapacity: i64(), RequestsRateMicro: i64(),
				MaxConcurrent: i64(), PeriodBudget: i64(), Period: rule.Period(str()), ReservationTTL: time.Duration(i64()),
				MaxWait: time.Duration(i64()), OnStoreUnavailable: rule.Policy(str())}},
	}
}

func TestEncodeReservationWritesWhatEncodingJSONWrites(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 5000 {
		r := randomReservation(rng)
		want, err := reflectEncode(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := EncodeReservation(r)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("case %d:\n got %s\nwant %s", i, got, want)
		}
	}
	// A time encoding/json refuses is refused too, not written wrongly.
	r := randomReservation(rng)
	r.ExpiresAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := reflectEncode(r); err == nil {
		t.Fatal("encoding/json took the year 10000")
	}
	if _, err := EncodeReservation(r); err == nil {
		t.Fatal("EncodeReservation took the year 10000")
	}
}

func BenchmarkEncodeReservation(b *testing.B) {
	r := randomReservation(rand.New(rand.NewPCG(3, 4)))
	r.AdmissionID, r.Estimate.Model, r.Estimate.Family, r.Snapshot.TenantID = "adm_06h3e0000000000000000000ab", "gpt-4o-mini", "gpt-4o-mini", "acme"
	r.Snapshot.Limits.Period, r.Snapshot.Limits.OnStoreUnavailable = "month", "local"
	b.Run("hand", func(b *testing.B) {
		for b.Loop() {
			_, _ = EncodeReservation(r)
		}
	})
	b.Run("reflect", func(b *testing.B) {
		for b.Loop() {
			_, _ = reflectEncode(r)
		}
	})
}
