package account

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
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
//
// Every keyed admission (each of the rate limit service's) is encoded in
// the decision, so the bytes are appended by hand, in the order and form
// encoding/json gives storedReservation (a test holds the two equal): the
// reflective encoder cost a twentieth of the replica's CPU.
func EncodeReservation(r *Reservation) ([]byte, error) {
	for _, t := range []time.Time{r.CreatedAt, r.ExpiresAt, r.Snapshot.At, r.Snapshot.PeriodStart, r.Snapshot.PeriodEnd} {
		if y := t.Year(); y < 0 || y > 9999 {
			return nil, fmt.Errorf("budget: encode reservation: time %v out of range", t)
		}
	}
	s, l, e := r.Snapshot, r.Snapshot.Limits, r.Estimate
	b := make([]byte, 0, 768)
	b = append(b, `{"admission_id":`...)
	b = appendJSONString(b, r.AdmissionID)
	b = append(b, `,"estimate":{"Model":`...)
	b = appendJSONString(b, e.Model)
	b = append(b, `,"Family":`...)
	b = appendJSONString(b, e.Family)
	b = appendInt(b, `,"InputTokens":`, e.InputTokens)
	b = appendInt(b, `,"OutputTokens":`, e.OutputTokens)
	b = appendInt(b, `,"Cost":`, e.Cost)
	b = append(b, `,"Approximate":`...)
	b = strconv.AppendBool(b, e.Approximate)
	b = appendInt(b, `,"InputWeightMicro":`, e.InputWeightMicro)
	b = appendInt(b, `,"OutputWeightMicro":`, e.OutputWeightMicro)
	b = appendTime(b, `},"created_at":`, r.CreatedAt)
	b = appendTime(b, `,"expires_at":`, r.ExpiresAt)
	b = append(b, `,"snapshot":{"TenantID":`...)
	b = appendJSONString(b, s.TenantID)
	b = appendTime(b, `,"At":`, s.At)
	b = appendInt(b, `,"Limits":{"TokensCapacity":`, l.TokensCapacity)
	b = appendInt(b, `,"TokensRateMicro":`, l.TokensRateMicro)
	b = appendInt(b, `,"RequestsCapacity":`, l.RequestsCapacity)
	b = appendInt(b, `,"RequestsRateMicro":`, l.RequestsRateMicro)
	b = appendInt(b, `,"MaxConcurrent":`, l.MaxConcurrent)
	b = appendInt(b, `,"PeriodBudget":`, l.PeriodBudget)
	b = append(b, `,"Period":`...)
	b = appendJSONString(b, string(l.Period))
	b = appendInt(b, `,"ReservationTTL":`, int64(l.ReservationTTL))
	b = appendInt(b, `,"MaxWait":`, int64(l.MaxWait))
	b = append(b, `,"OnStoreUnavailable":`...)
	b = appendJSONString(b, string(l.OnStoreUnavailable))
	b = append(b, `},"Disabled":`...)
	b = strconv.AppendBool(b, s.Disabled)
	b = appendInt(b, `,"TokensMicro":`, s.TokensMicro)
	b = appendInt(b, `,"TokensFullIn":`, int64(s.TokensFullIn))
	b = appendInt(b, `,"RequestsMicro":`, s.RequestsMicro)
	b = appendInt(b, `,"RequestsFullIn":`, int64(s.RequestsFullIn))
	b = appendInt(b, `,"OpenReservations":`, s.OpenReservations)
	b = appendTime(b, `,"PeriodStart":`, s.PeriodStart)
	b = appendTime(b, `,"PeriodEnd":`, s.PeriodEnd)
	b = appendInt(b, `,"PeriodUsed":`, s.PeriodUsed)
	b = appendInt(b, `,"LedgerSeq":`, s.LedgerSeq)
	return append(b, "}}"...), nil
}

func appendInt(b []byte, key string, v int64) []byte {
	return strconv.AppendInt(append(b, key...), v, 10)
}

// appendTime appends key and t as encoding/json writes a time.Time
// (RFC 3339 with nanoseconds, quoted).
func appendTime(b []byte, key string, t time.Time) []byte {
	b = append(append(b, key...), '"')
	return append(t.AppendFormat(b, time.RFC3339Nano), '"')
}

// appendJSONString appends v quoted as encoding/json quotes it. Ids, model
// names and limit names are plain ASCII and are copied as they are; any
// other string goes through encoding/json, for its escapes (HTML
// characters, control characters, U+2028, invalid UTF-8).
func appendJSONString(b []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(v) // a string always encodes
			return append(b, q...)
		}
	}
	return append(append(append(b, '"'), v...), '"')
}

// DecodeReservation reads what EncodeReservation wrote.
func DecodeReservation(b []byte) (*Reservation, error) {
	var s storedReservation
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("budget: stored reservation: %w", err)
	}
	sn, l := s.Snapshot, s.Snapshot.Limits
	return &Reservation{AdmissionID: s.AdmissionID, Estimate: s.Estimate.Estimate(), CreatedAt: s.CreatedAt, ExpiresAt: s.ExpiresAt,
		Snapshot: rule.Snapshot{TenantID: sn.TenantID, At: sn.At, Disabled: sn.Disabled, TokensMicro: sn.TokensMicro,
			TokensFullIn: sn.TokensFullIn, RequestsMicro: sn.RequestsMicro, RequestsFullIn: sn.RequestsFullIn,
			OpenReservations: sn.OpenReservations, PeriodStart: sn.PeriodStart, PeriodEnd: sn.PeriodEnd, PeriodUsed: sn.PeriodUsed,
			LedgerSeq: sn.LedgerSeq,
			Limits: rule.Limits{TokensCapacity: l.TokensCapacity, TokensRateMicro: l.TokensRateMicro,
				RequestsCapacity: l.RequestsCapacity, RequestsRateMicro: l.RequestsRateMicro, MaxConcurrent: l.MaxConcurrent,
				PeriodBudget: l.PeriodBudget, Period: rule.Period(l.Period), ReservationTTL: l.ReservationTTL, MaxWait: l.MaxWait,
				OnStoreUnavailable: rule.Policy(l.OnStoreUnavailable)}},
	}, nil
}
