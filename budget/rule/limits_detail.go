package rule

import (
	"encoding/json"
	"fmt"
	"time"
)

// LimitsDetail is limits in their one JSON shape: how a ledger entry's
// detail records them, how an end-user policy's template is stored, and
// the admin API's limit field names. Limits.Detail writes it and
// LimitsDetail.Limits reads it back.
type LimitsDetail struct {
	TokensCapacity      int64    `json:"tokens_capacity"`
	TokensPerSecond     string   `json:"tokens_per_second"`
	RequestsCapacity    int64    `json:"requests_capacity,omitempty"`
	RequestsPerSecond   string   `json:"requests_per_second,omitempty"`
	MaxConcurrent       int64    `json:"max_concurrent,omitempty"`
	PeriodBudget        int64    `json:"period_budget,omitempty"`
	Period              string   `json:"period,omitempty"`
	ReservationTTLMilli int64    `json:"reservation_ttl_ms"`
	MaxWaitMilli        int64    `json:"max_wait_ms"`
	OnStoreUnavailable  string   `json:"on_store_unavailable,omitempty"`
	Shadow              []string `json:"shadow,omitempty"`
	// Windows are the tenant's windows (the "period" window among them).
	Windows []WindowJSON `json:"windows,omitempty"`
}

// Detail is l in its one JSON shape (LimitsDetail).
func (l Limits) Detail() LimitsDetail {
	d := LimitsDetail{
		TokensCapacity:      l.TokensCapacity,
		TokensPerSecond:     FormatRate(l.TokensRateMicro),
		RequestsCapacity:    l.RequestsCapacity,
		MaxConcurrent:       l.MaxConcurrent,
		PeriodBudget:        l.PeriodBudget,
		Period:              string(l.Period),
		ReservationTTLMilli: l.ReservationTTL.Milliseconds(),
		MaxWaitMilli:        l.MaxWait.Milliseconds(),
		OnStoreUnavailable:  string(l.OnStoreUnavailable),
	}
	if l.Shadow != 0 {
		d.Shadow = l.Shadow.Strings()
	}
	if len(l.Windows) > 0 {
		d.Windows = WindowsJSON(l.Windows)
	}
	if l.RequestsRateMicro > 0 {
		d.RequestsPerSecond = FormatRate(l.RequestsRateMicro)
	}
	return d
}

// LimitsJSON is l as JSON, in the one shape limits have in ledger details
// and end-user templates (the admin API's limit field names).
func LimitsJSON(l Limits) json.RawMessage {
	b, _ := json.Marshal(l.Detail()) // plain fields: cannot fail
	return b
}

// Limits reads limits back from their detail shape (Limits.Detail). The
// windows' zones load as StoredZone reads them: the shape is stored.
func (d LimitsDetail) Limits() (Limits, error) {
	l := Limits{
		TokensCapacity:     d.TokensCapacity,
		RequestsCapacity:   d.RequestsCapacity,
		MaxConcurrent:      d.MaxConcurrent,
		PeriodBudget:       d.PeriodBudget,
		Period:             Period(d.Period),
		ReservationTTL:     time.Duration(d.ReservationTTLMilli) * time.Millisecond,
		MaxWait:            time.Duration(d.MaxWaitMilli) * time.Millisecond,
		OnStoreUnavailable: Policy(d.OnStoreUnavailable),
	}
	var err error
	if l.TokensRateMicro, err = ParseRate(d.TokensPerSecond); err != nil {
		return l, fmt.Errorf("budget: limits: tokens_per_second: %w", err)
	}
	if d.RequestsPerSecond != "" {
		if l.RequestsRateMicro, err = ParseRate(d.RequestsPerSecond); err != nil {
			return l, fmt.Errorf("budget: limits: requests_per_second: %w", err)
		}
	}
	if l.Shadow, err = ParseLimitSet("shadow", d.Shadow); err != nil {
		return l, err
	}
	if len(d.Windows) > 0 {
		// A stored template: its zones load as StoredZone reads them.
		if l.Windows, err = ParseWindowsWith(d.Windows, StoredZone); err != nil {
			return l, err
		}
	}
	return l, nil
}

// SameLimits reports whether a and b are the same limits, by their one
// JSON shape (so that a field added to Limits is compared too).
func SameLimits(a, b Limits) bool { return string(LimitsJSON(a)) == string(LimitsJSON(b)) }
