package budget

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/tokengate/tokengate/estimator"
)

// The stored form of an admission: what an Idempotency-Key keeps for 24 h
// (idempotency_keys.response), and what the local failure policy spools
// for its replay. It is an on-disk format, so it has its own types with
// explicit keys: renaming a Go field elsewhere cannot change it, and a
// golden test pins it. The keys are those the first release wrote, so
// responses stored before this type existed still read back.
type storedReservation struct {
	AdmissionID string         `json:"admission_id"`
	Estimate    StoredEstimate `json:"estimate"`
	CreatedAt   time.Time      `json:"created_at"`
	ExpiresAt   time.Time      `json:"expires_at"`
	Snapshot    storedSnapshot `json:"snapshot"`
}

// StoredEstimate is an estimate in the stored forms (the idempotent
// response, and the spool's records).
type StoredEstimate struct {
	Model             string `json:"Model"`
	Family            string `json:"Family"`
	InputTokens       int64  `json:"InputTokens"`
	OutputTokens      int64  `json:"OutputTokens"`
	Cost              int64  `json:"Cost"`
	Approximate       bool   `json:"Approximate"`
	InputWeightMicro  int64  `json:"InputWeightMicro"`
	OutputWeightMicro int64  `json:"OutputWeightMicro"`
}

// StoreEstimate is e in its stored form.
func StoreEstimate(e estimator.Estimate) StoredEstimate {
	return StoredEstimate{Model: e.Model, Family: e.Family, InputTokens: e.InputTokens, OutputTokens: e.OutputTokens,
		Cost: e.Cost, Approximate: e.Approximate, InputWeightMicro: e.InputWeightMicro, OutputWeightMicro: e.OutputWeightMicro}
}

// Estimate is the stored estimate read back.
func (s StoredEstimate) Estimate() estimator.Estimate {
	return estimator.Estimate{Model: s.Model, Family: s.Family, InputTokens: s.InputTokens, OutputTokens: s.OutputTokens,
		Cost: s.Cost, Approximate: s.Approximate, InputWeightMicro: s.InputWeightMicro, OutputWeightMicro: s.OutputWeightMicro}
}

type storedLimits struct {
	TokensCapacity     int64         `json:"TokensCapacity"`
	TokensRateMicro    int64         `json:"TokensRateMicro"`
	RequestsCapacity   int64         `json:"RequestsCapacity"`
	RequestsRateMicro  int64         `json:"RequestsRateMicro"`
	MaxConcurrent      int64         `json:"MaxConcurrent"`
	PeriodBudget       int64         `json:"PeriodBudget"`
	Period             string        `json:"Period"`
	ReservationTTL     time.Duration `json:"ReservationTTL"`
	MaxWait            time.Duration `json:"MaxWait"`
	OnStoreUnavailable string        `json:"OnStoreUnavailable"`
}

type storedSnapshot struct {
	TenantID         string        `json:"TenantID"`
	At               time.Time     `json:"At"`
	Limits           storedLimits  `json:"Limits"`
	Disabled         bool          `json:"Disabled"`
	TokensMicro      int64         `json:"TokensMicro"`
	TokensFullIn     time.Duration `json:"TokensFullIn"`
	RequestsMicro    int64         `json:"RequestsMicro"`
	RequestsFullIn   time.Duration `json:"RequestsFullIn"`
	OpenReservations int64         `json:"OpenReservations"`
	PeriodStart      time.Time     `json:"PeriodStart"`
	PeriodEnd        time.Time     `json:"PeriodEnd"`
	PeriodUsed       int64         `json:"PeriodUsed"`
	LedgerSeq        int64         `json:"LedgerSeq"`
}

// EncodeReservation is how an admission is stored for its Idempotency-Key:
// what a retry within 24 h gets back. The local failure policy stores its
// admissions the same way, so their replay can write the key.
func EncodeReservation(r *Reservation) ([]byte, error) {
	s, l := r.Snapshot, r.Snapshot.Limits
	b, err := json.Marshal(storedReservation{
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
	if err != nil {
		return nil, fmt.Errorf("budget: encode reservation: %w", err)
	}
	return b, nil
}

// DecodeReservation reads what EncodeReservation wrote.
func DecodeReservation(b []byte) (*Reservation, error) {
	var s storedReservation
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("budget: stored reservation: %w", err)
	}
	sn, l := s.Snapshot, s.Snapshot.Limits
	return &Reservation{AdmissionID: s.AdmissionID, Estimate: s.Estimate.Estimate(), CreatedAt: s.CreatedAt, ExpiresAt: s.ExpiresAt,
		Snapshot: Snapshot{TenantID: sn.TenantID, At: sn.At, Disabled: sn.Disabled, TokensMicro: sn.TokensMicro,
			TokensFullIn: sn.TokensFullIn, RequestsMicro: sn.RequestsMicro, RequestsFullIn: sn.RequestsFullIn,
			OpenReservations: sn.OpenReservations, PeriodStart: sn.PeriodStart, PeriodEnd: sn.PeriodEnd, PeriodUsed: sn.PeriodUsed,
			LedgerSeq: sn.LedgerSeq,
			Limits: Limits{TokensCapacity: l.TokensCapacity, TokensRateMicro: l.TokensRateMicro,
				RequestsCapacity: l.RequestsCapacity, RequestsRateMicro: l.RequestsRateMicro, MaxConcurrent: l.MaxConcurrent,
				PeriodBudget: l.PeriodBudget, Period: Period(l.Period), ReservationTTL: l.ReservationTTL, MaxWait: l.MaxWait,
				OnStoreUnavailable: Policy(l.OnStoreUnavailable)}},
	}, nil
}
