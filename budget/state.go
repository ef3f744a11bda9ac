package budget

import (
	"strconv"
	"time"
)

// TenantState is what one decision reads and changes: a tenant's limits and
// balances, advanced to the decision's time. The store keeps it in the
// tenant's row; a replica under the local failure policy keeps its share of
// it in memory. Both decide with Decide and take an admission with Debit,
// replay debits with Debit, and every settle, release and expiry ends with
// End, so each rule is written once.
type TenantState struct {
	Limits   Limits
	Tokens   Bucket
	Requests Bucket // CapacityMicro == 0: no request bucket
	// Open counts reservations not yet settled, released or expired.
	Open int64
	// PeriodStart is the window PeriodUsed counts (nil before the first
	// decision of a tenant with a period budget).
	PeriodStart *time.Time
	PeriodUsed  int64
}

// Advance brings every balance to now: token and request refill, and the
// period window. It returns the token refill it added, and whether a new
// period began.
func (s *TenantState) Advance(now time.Time) (refill int64, rolled bool) {
	refill = s.Tokens.Refill(now)
	if s.Requests.CapacityMicro > 0 {
		if s.Requests.At.IsZero() {
			s.Requests.At = now
		}
		s.Requests.Refill(now)
	}
	if s.Limits.Period != PeriodNone {
		start := s.Limits.Period.start(now)
		if s.PeriodStart == nil || start.After(*s.PeriodStart) {
			s.PeriodStart = &start
			s.PeriodUsed = 0
			rolled = true
		}
	}
	return refill, rolled
}

// Decide is the admission decision: whether a request costing cost fits s
// at now (s advanced to now). It returns nil; a *TooLargeError when the cost
// exceeds a capacity, so the request can never fit; or a *RejectedError
// naming the first limit that refuses it, in the order tokens, requests,
// concurrency, period_budget, with the exact time until it could fit
// (rounded up to the millisecond). It changes nothing: a refusal consumes
// nothing. Shadow limits are not exempt here: the store's decision, which
// knows them, uses Refusals.
func Decide(s TenantState, cost int64, now time.Time) error {
	if r := Refusals(s, cost, now); len(r) > 0 {
		return r[0]
	}
	return nil
}

// Refusals is every limit of s that refuses a request costing cost at now,
// each a *TooLargeError or a *RejectedError: the too-large ones first, then
// the rest in the order tokens, requests, concurrency, period_budget. A
// decision needs them all to tell shadow limits (counted, never refusing)
// from enforced ones.
func Refusals(s TenantState, cost int64, now time.Time) []error {
	l := s.Limits
	var out []error
	if cost > l.TokensCapacity {
		out = append(out, &TooLargeError{Limit: LimitTokens, Cost: cost, Capacity: l.TokensCapacity})
	}
	if l.PeriodBudget > 0 && cost > l.PeriodBudget {
		out = append(out, &TooLargeError{Limit: LimitPeriodBudget, Cost: cost, Capacity: l.PeriodBudget})
	}
	if need := cost * Micro; need > s.Tokens.BalanceMicro && cost <= l.TokensCapacity {
		out = append(out, &RejectedError{Limit: LimitTokens, RetryAfter: roundUpMS(s.Tokens.TimeUntil(need))})
	}
	if s.Requests.CapacityMicro > 0 && s.Requests.BalanceMicro < Micro {
		out = append(out, &RejectedError{Limit: LimitRequests, RetryAfter: roundUpMS(s.Requests.TimeUntil(Micro))})
	}
	if l.MaxConcurrent > 0 && s.Open >= l.MaxConcurrent {
		out = append(out, &RejectedError{Limit: LimitConcurrency, RetryAfter: ConcurrencyRetryHint})
	}
	if l.PeriodBudget > 0 && cost <= l.PeriodBudget && s.PeriodStart != nil && s.PeriodUsed+cost > l.PeriodBudget {
		out = append(out, &RejectedError{Limit: LimitPeriodBudget, RetryAfter: roundUpMS(l.Period.next(*s.PeriodStart).Sub(now))})
	}
	return out
}

// limitOf is the limit a refusal from Refusals names.
func limitOf(err error) Limit {
	switch e := err.(type) {
	case *TooLargeError:
		return e.Limit
	case *RejectedError:
		return e.Limit
	}
	return ""
}

// ConcurrencyRetryHint is the Retry-After given when the concurrency limit
// refuses a request: a slot frees when some reservation is settled,
// released or expires, which no clock can predict.
const ConcurrencyRetryHint = time.Second

// Debit takes an admitted request from s: its cost from the tokens and the
// period, one request, one open slot. The balance may go negative only
// through replay of decisions made without the store, and never below the
// debt floor (minus one capacity). It returns the effective change of the
// token balance, or an *OverflowError (ErrOverflow) with s unchanged.
func (s *TenantState) Debit(cost int64) (int64, error) { return s.DebitExcept(cost, 0) }

// DebitExcept is Debit, leaving out the limits in skip: shadow limits that
// would have refused the request. A shadow limit's state is what it would
// be if it were enforced, so that turning enforcement on changes nothing
// but the answers, and its would-be refusals count what it would refuse.
func (s *TenantState) DebitExcept(cost int64, skip LimitSet) (int64, error) {
	if cost < 0 {
		return 0, &OverflowError{Field: "cost", Op: "a negative cost"}
	}
	need, err := micro("cost", cost)
	if err != nil {
		return 0, err
	}
	used := s.PeriodUsed
	if s.Limits.Period != PeriodNone && !skip.Has(LimitPeriodBudget) {
		if used, err = addMicro("period_used", used, cost); err != nil {
			return 0, err
		}
	}
	var applied int64
	if !skip.Has(LimitTokens) {
		applied = s.Tokens.Refund(-need)
	}
	if s.Requests.CapacityMicro > 0 && !skip.Has(LimitRequests) {
		s.Requests.BalanceMicro -= Micro
	}
	if !skip.Has(LimitConcurrency) {
		s.Open++
	}
	s.PeriodUsed = used
	return applied, nil
}

// Undebit gives back a Debit that was never made durable (a local decision
// its journal refused): applied is what the Debit returned.
func (s *TenantState) Undebit(cost, applied int64) {
	s.Tokens.BalanceMicro -= applied
	if s.Requests.CapacityMicro > 0 {
		s.Requests.BalanceMicro += Micro
	}
	s.Open--
	if s.Limits.Period != PeriodNone {
		s.PeriodUsed -= cost
	}
}

// End reconciles an admission that reserved estimate at createdAt with
// what it actually cost (0 for a release): it refunds estimate - actual,
// capped at capacity, or charges the excess, which may drive the balance
// negative down to the debt floor (minus one capacity), and frees the open
// slot unless expiry freed it already (late). The period window: an extra
// charge always counts against the current window; a refund only returns
// what was taken from it, so a reservation from a previous window refunds
// nothing there. It returns the effective change of the token balance, or
// an *OverflowError (ErrOverflow) with s unchanged.
func (s *TenantState) End(estimate, actual int64, createdAt time.Time, late bool) (int64, error) {
	return s.EndExcept(estimate, actual, createdAt, late, 0)
}

// EndExcept is End for an admission whose debit left out the limits in
// skip (DebitExcept): they get neither refund nor charge.
func (s *TenantState) EndExcept(estimate, actual int64, createdAt time.Time, late bool, skip LimitSet) (int64, error) {
	if estimate < 0 || actual < 0 {
		return 0, &OverflowError{Field: "cost", Op: "a negative cost"}
	}
	diff := actual - estimate // both non-negative: cannot overflow
	refund, err := micro("cost", -diff)
	if err != nil {
		return 0, err
	}
	used := s.PeriodUsed
	if s.Limits.Period == PeriodNone || skip.Has(LimitPeriodBudget) {
		// no period budget: nothing to count
	} else if diff > 0 {
		if used, err = addMicro("period_used", used, diff); err != nil {
			return 0, err
		}
	} else if s.PeriodStart != nil && !createdAt.Before(*s.PeriodStart) {
		used = max(0, used+diff)
	}
	var applied int64
	if !skip.Has(LimitTokens) {
		applied = s.Tokens.Refund(refund)
	}
	if !late && !skip.Has(LimitConcurrency) {
		s.Open--
	}
	s.PeriodUsed = used
	return applied, nil
}

// Expire ends an overdue reservation: it stays charged at its estimate and
// frees its open slot.
func (s *TenantState) Expire() { s.ExpireExcept(0) }

// ExpireExcept is Expire for an admission whose debit left out skip.
func (s *TenantState) ExpireExcept(skip LimitSet) {
	if !skip.Has(LimitConcurrency) {
		s.Open = max(0, s.Open-1)
	}
}

// Snapshot is a tenant's limits and balances at one instant, for the
// response headers and the budget endpoint.
type Snapshot struct {
	TenantID string
	// Path is the tenant's ancestors, root first (empty for a tenant
	// without a parent): an admission must fit every one of them too.
	Path             []string
	At               time.Time
	Limits           Limits
	Disabled         bool
	TokensMicro      int64
	TokensFullIn     time.Duration
	RequestsMicro    int64 // meaningful when Limits.RequestsCapacity > 0
	RequestsFullIn   time.Duration
	OpenReservations int64
	PeriodStart      time.Time // zero without a period budget
	PeriodEnd        time.Time
	PeriodUsed       int64
	LedgerSeq        int64
}

// Snapshot renders s at now for tenantID.
func (s TenantState) Snapshot(tenantID string, now time.Time) Snapshot {
	snap := Snapshot{
		TenantID:         tenantID,
		At:               now,
		Limits:           s.Limits,
		TokensMicro:      s.Tokens.BalanceMicro,
		TokensFullIn:     roundUpMS(s.Tokens.TimeUntilFull()),
		OpenReservations: s.Open,
		PeriodUsed:       s.PeriodUsed,
	}
	if s.Requests.CapacityMicro > 0 {
		snap.RequestsMicro = s.Requests.BalanceMicro
		snap.RequestsFullIn = roundUpMS(s.Requests.TimeUntilFull())
	}
	if s.Limits.Period != PeriodNone && s.PeriodStart != nil {
		snap.PeriodStart = *s.PeriodStart
		snap.PeriodEnd = s.Limits.Period.next(*s.PeriodStart)
	}
	return snap
}

// Parent is the tenant's parent ("" for none).
func (s Snapshot) Parent() string {
	if len(s.Path) == 0 {
		return ""
	}
	return s.Path[len(s.Path)-1]
}

// Tokens is the token balance in whole tokens, rounded down (negative while
// the tenant is in debt).
func (s Snapshot) Tokens() int64 { return floorDiv(s.TokensMicro, Micro) }

// Requests is the request balance in whole requests, rounded down.
func (s Snapshot) Requests() int64 { return floorDiv(s.RequestsMicro, Micro) }

// PeriodRemaining is what the period budget has left, never below zero.
func (s Snapshot) PeriodRemaining() int64 { return max(0, s.Limits.PeriodBudget-s.PeriodUsed) }

// Header is one response header.
type Header struct{ Name, Value string }

// RateHeaders are OpenAI's x-ratelimit headers for the snapshot (the
// request ones only when the tenant has a request bucket). Every face
// sends the same ones, so a client reads tokengate's answers alike
// whichever way it came in.
func (s Snapshot) RateHeaders() []Header {
	h := []Header{
		{"X-Ratelimit-Limit-Tokens", strconv.FormatInt(s.Limits.TokensCapacity, 10)},
		{"X-Ratelimit-Remaining-Tokens", strconv.FormatInt(max(0, s.Tokens()), 10)},
		{"X-Ratelimit-Reset-Tokens", s.TokensFullIn.String()},
	}
	if s.Limits.RequestsCapacity > 0 {
		h = append(h,
			Header{"X-Ratelimit-Limit-Requests", strconv.FormatInt(s.Limits.RequestsCapacity, 10)},
			Header{"X-Ratelimit-Remaining-Requests", strconv.FormatInt(max(0, s.Requests()), 10)},
			Header{"X-Ratelimit-Reset-Requests", s.RequestsFullIn.String()})
	}
	return h
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
