package rule

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// DefaultReservationTTL is how long a reservation stays open unless the
// tenant's limits say otherwise.
const DefaultReservationTTL = 10 * time.Minute

// DefaultMaxWait caps how long a caller of this tenant may wait for tokens.
const DefaultMaxWait = 30 * time.Second

// Limits are a tenant's configured limits. A zero optional limit is not
// configured.
type Limits struct {
	TokensCapacity    int64 // burst size, in cost units
	TokensRateMicro   int64 // refill, in micro cost units per second
	RequestsCapacity  int64 // optional request Bucket
	RequestsRateMicro int64
	MaxConcurrent     int64 // optional cap on open reservations
	// PeriodBudget and Period are the window named "period" (a budget of
	// tokens per UTC day or month), as the API spelled it before Windows:
	// setting them sets that window, and a plain "period" window shows in
	// them (SyncPeriod).
	PeriodBudget int64
	Period       Period
	// Windows are the tenant's calendar windows (windows.go), each a
	// budget of tokens or money per hour, day, week or month in a time
	// zone.
	Windows        []WindowLimit
	ReservationTTL time.Duration
	MaxWait        time.Duration // longest max_wait_ms honoured
	// OnStoreUnavailable is the tenant's failure policy; "" defers to the
	// server's default. A model's own policy takes precedence.
	OnStoreUnavailable Policy
	// Shadow are the limits evaluated and counted on every decision but
	// never refusing: a new limit is tried on real traffic before it is
	// enforced.
	Shadow LimitSet
}

// LimitSet is a set of a tenant's limits.
type LimitSet uint8

// AllLimits are the limits a tenant can have, in the order they are checked.
var AllLimits = []Limit{LimitTokens, LimitRequests, LimitConcurrency, LimitPeriodBudget}

func (l Limit) bit() LimitSet {
	for i, x := range AllLimits {
		if x == l {
			return 1 << i
		}
	}
	for i, x := range ModelLimitNames {
		if x == l {
			return 1 << (len(AllLimits) + i)
		}
	}
	return 0
}

// Has reports whether l is in the set.
func (s LimitSet) Has(l Limit) bool { return l.bit() != 0 && s&l.bit() != 0 }

// With returns the set with l added.
func (s LimitSet) With(l Limit) LimitSet { return s | l.bit() }

// Limits lists the set's members in check order.
func (s LimitSet) Limits() []Limit {
	var out []Limit
	for _, l := range append(AllLimits[:len(AllLimits):len(AllLimits)], ModelLimitNames...) {
		if s.Has(l) {
			out = append(out, l)
		}
	}
	return out
}

// Strings lists the set's members as their names.
func (s LimitSet) Strings() []string {
	out := []string{}
	for _, l := range s.Limits() {
		out = append(out, string(l))
	}
	return out
}

// ParseLimitSet reads limit names ("tokens", "requests", "concurrency",
// "period_budget", and a model's "input_tokens" and "output_tokens"). It
// returns a *LimitError naming field.
func ParseLimitSet(field string, names []string) (LimitSet, error) {
	var s LimitSet
	for _, n := range names {
		l := Limit(strings.TrimSpace(n))
		if l == "" {
			continue
		}
		if l.bit() == 0 {
			return 0, &LimitError{field, fmt.Sprintf("unknown limit %q: want tokens, requests, concurrency, period_budget (a tenant's) or input_tokens, output_tokens (a model's)", n)}
		}
		s = s.With(l)
	}
	return s, nil
}

// Policy says what a replica does with an admission when the store cannot
// be reached.
type Policy string

// The failure policies.
const (
	PolicyDefault Policy = ""
	// PolicyReject answers 503 store_unavailable with a Retry-After.
	PolicyReject Policy = "reject"
	// PolicyLocal admits against this replica's share of the tenant's
	// bucket and replays the admissions into the store when it is back.
	PolicyLocal Policy = "local"
)

// Valid reports whether p is a known policy (or the default).
func (p Policy) Valid() bool { return p == PolicyDefault || p == PolicyReject || p == PolicyLocal }

var tenantIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// ValidateTenantID reports whether id can name a tenant: 1 to 63 characters
// of a-z, 0-9, '_', '.', '-', starting with a letter or digit.
func ValidateTenantID(id string) error {
	if !tenantIDPattern.MatchString(id) {
		return &LimitError{Field: "id", Reason: "must be 1-63 characters of a-z, 0-9, '_', '.', '-', starting with a letter or digit"}
	}
	return nil
}

// MaxAmount keeps capacities small enough that micro-unit arithmetic on
// them never overflows int64 (9.2e18 / 1e6 = 9.2e12, with headroom).
const MaxAmount = 1_000_000_000_000

// Validate returns a *LimitError naming the first invalid field, after
// filling defaults.
func (l *Limits) Validate() error {
	if l.ReservationTTL == 0 {
		l.ReservationTTL = DefaultReservationTTL
	}
	if l.MaxWait == 0 {
		l.MaxWait = DefaultMaxWait
	}
	switch {
	case l.TokensCapacity <= 0 || l.TokensCapacity > MaxAmount:
		return &LimitError{"tokens_capacity", fmt.Sprintf("must be between 1 and %d", int64(MaxAmount))}
	case l.TokensRateMicro <= 0 || l.TokensRateMicro > MaxAmount*Micro/1000:
		return &LimitError{"tokens_per_second", "must be greater than 0 (and at most 1e9)"}
	case l.RequestsCapacity < 0 || l.RequestsCapacity > MaxAmount:
		return &LimitError{"requests_capacity", "must be positive"}
	case l.RequestsRateMicro < 0 || l.RequestsRateMicro > MaxAmount*Micro/1000:
		return &LimitError{"requests_per_second", "must be positive"}
	case (l.RequestsCapacity == 0) != (l.RequestsRateMicro == 0):
		return &LimitError{"requests_per_second", "requests_capacity and requests_per_second are set together"}
	case l.MaxConcurrent < 0 || l.MaxConcurrent > math.MaxInt32:
		return &LimitError{"max_concurrent", "must be positive"}
	case l.PeriodBudget < 0 || l.PeriodBudget > MaxAmount:
		return &LimitError{"period_budget", "must be positive"}
	case l.Period != PeriodNone && l.Period != PeriodDay && l.Period != PeriodMonth:
		return &LimitError{"period", `must be "day" or "month"`}
	case (l.PeriodBudget == 0) != (l.Period == PeriodNone):
		return &LimitError{"period", "period_budget and period are set together"}
	case l.ReservationTTL < time.Second || l.ReservationTTL > 7*24*time.Hour:
		return &LimitError{"reservation_ttl", "must be between 1s and 168h"}
	case l.MaxWait < 0 || l.MaxWait > 10*time.Minute:
		return &LimitError{"max_wait", "must be between 0 and 10m"}
	case !l.OnStoreUnavailable.Valid():
		return &LimitError{"on_store_unavailable", `must be "reject", "local" or unset`}
	case l.Shadow.Has(LimitInputTokens) || l.Shadow.Has(LimitOutputTokens):
		return &LimitError{"shadow", "input_tokens and output_tokens are a model's limits: set them shadow in the tenant's model limits"}
	case l.Shadow.Has(LimitRequests) && l.RequestsCapacity == 0:
		return &LimitError{"shadow", "requests is not configured, so it cannot be a shadow limit"}
	case l.Shadow.Has(LimitConcurrency) && l.MaxConcurrent == 0:
		return &LimitError{"shadow", "concurrency is not configured, so it cannot be a shadow limit"}
	}
	l.SyncPeriod()
	if err := validateWindows(l.Windows); err != nil {
		return err
	}
	if l.Shadow.Has(LimitPeriodBudget) && len(l.Windows) == 0 {
		return &LimitError{"shadow", "period_budget is not configured (no window), so it cannot be a shadow limit"}
	}
	return nil
}

// ParseRate parses a decimal rate such as "100", "2.5" or "0.000001" into
// micro-units per second, exactly (no floating point).
func ParseRate(s string) (int64, error) {
	s = strings.TrimSpace(s)
	whole, frac, hasFrac := strings.Cut(s, ".")
	if whole == "" && !hasFrac || strings.HasPrefix(whole, "-") || strings.HasPrefix(whole, "+") {
		return 0, fmt.Errorf("rate %q: want a non-negative decimal number", s)
	}
	if len(frac) > 6 {
		return 0, fmt.Errorf("rate %q: at most 6 decimal places", s)
	}
	if strings.ContainsAny(frac, "+-") {
		return 0, fmt.Errorf("rate %q: want a non-negative decimal number", s)
	}
	if whole == "" {
		whole = "0"
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w > MaxAmount {
		return 0, fmt.Errorf("rate %q: want a non-negative decimal number up to %d", s, int64(MaxAmount))
	}
	var f int64
	if frac != "" {
		f, err = strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64)
		if err != nil || f < 0 {
			return 0, fmt.Errorf("rate %q: want a non-negative decimal number", s)
		}
	}
	return w*Micro + f, nil
}

// FormatRate renders micro-units per second as the shortest exact decimal.
func FormatRate(micro int64) string {
	s := strconv.FormatInt(micro/Micro, 10)
	if frac := micro % Micro; frac != 0 {
		s += "." + strings.TrimRight(fmt.Sprintf("%06d", frac), "0")
	}
	return s
}
