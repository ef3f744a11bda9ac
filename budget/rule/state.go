package rule

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
	// Windows is what each of Limits.Windows has counted, index for index.
	Windows []WindowUsage
}

// Advance brings every balance to now: token and request refill, and each
// window. It returns the token refill it added, and whether a window began
// anew.
func (s *TenantState) Advance(now time.Time) (refill int64, rolled bool) {
	refill = s.Tokens.Refill(now)
	if s.Requests.CapacityMicro > 0 {
		if s.Requests.At.IsZero() {
			s.Requests.At = now
		}
		s.Requests.Refill(now)
	}
	if len(s.Windows) != len(s.Limits.Windows) {
		s.Windows = append(s.Windows[:0:0], make([]WindowUsage, len(s.Limits.Windows))...)
	}
	for i, w := range s.Limits.Windows {
		u := &s.Windows[i]
		if start := w.Start(now); u.Start == nil || start.After(*u.Start) {
			u.Start, u.Used = &start, 0
			rolled = true
		}
	}
	return refill, rolled
}

// Amount is what an admission counts against a tenant: Cost in cost units
// (the buckets and token windows) and Money in micro-units of the currency
// (money windows; 0 when the model has no price).
type Amount struct {
	Cost  int64
	Money int64
}

// of is the part of a that window w counts.
func (a Amount) of(w WindowLimit) int64 {
	if w.Counts == CountMoney {
		return a.Money
	}
	return a.Cost
}

// Decide is the admission decision: whether a request costing cost fits s
// at now (s advanced to now). It returns nil; a *TooLargeError when the cost
// exceeds a capacity, so the request can never fit; or a *RejectedError
// naming the first limit that refuses it, in the order tokens, requests,
// concurrency, period_budget (the windows, in their order), with the exact
// time until it could fit (rounded up to the millisecond). It changes
// nothing: a refusal consumes nothing. Shadow limits are not exempt here:
// the store's decision, which knows them, uses Refusals.
func Decide(s TenantState, cost int64, now time.Time) error {
	if r := Refusals(s, Amount{Cost: cost}, now); len(r) > 0 {
		return r[0]
	}
	return nil
}

// Refusals is every limit of s that refuses a request counting a at now,
// each a *TooLargeError or a *RejectedError: the too-large ones first, then
// the rest in the order tokens, requests, concurrency, period_budget (each
// window that refuses, a *BudgetExhaustedError naming it, with what it
// spent, its cap and the exact time to its reset). A
// decision needs them all to tell shadow limits (counted, never refusing)
// from enforced ones.
func Refusals(s TenantState, a Amount, now time.Time) []error {
	l := s.Limits
	cost := a.Cost
	var out []error
	if cost > l.TokensCapacity {
		out = append(out, &TooLargeError{Limit: LimitTokens, Cost: cost, Capacity: l.TokensCapacity})
	}
	for _, w := range l.Windows {
		if n := a.of(w); n > w.Ceiling() {
			out = append(out, &TooLargeError{Limit: LimitPeriodBudget, Window: w.Name, Counts: w.Counts, Cost: n, Capacity: w.Ceiling()})
		}
	}
	if need := cost * Micro; need > s.Tokens.BalanceMicro && cost <= l.TokensCapacity {
		out = append(out, &RejectedError{Limit: LimitTokens, RetryAfter: RoundUpMS(s.Tokens.TimeUntil(need))})
	}
	if s.Requests.CapacityMicro > 0 && s.Requests.BalanceMicro < Micro {
		out = append(out, &RejectedError{Limit: LimitRequests, RetryAfter: RoundUpMS(s.Requests.TimeUntil(Micro))})
	}
	if l.MaxConcurrent > 0 && s.Open >= l.MaxConcurrent {
		out = append(out, &RejectedError{Limit: LimitConcurrency, RetryAfter: ConcurrencyRetryHint})
	}
	for i, w := range l.Windows {
		if i >= len(s.Windows) || s.Windows[i].Start == nil {
			continue
		}
		if n := a.of(w); n <= w.Ceiling() && s.Windows[i].Used+n > w.Ceiling() {
			resets := w.Next(*s.Windows[i].Start)
			out = append(out, &BudgetExhaustedError{
				RejectedError: RejectedError{Limit: LimitPeriodBudget, Window: w.Name, RetryAfter: RoundUpMS(resets.Sub(now))},
				Counts:        w.Counts, Spent: s.Windows[i].Used, Budget: w.Limit, Cap: w.Ceiling(), Cost: n, Resets: resets})
		}
	}
	return out
}

// LimitOf is the limit a refusal from Refusals names.
func LimitOf(err error) Limit {
	switch e := err.(type) {
	case *TooLargeError:
		return e.Limit
	case *RejectedError:
		return e.Limit
	case *BudgetExhaustedError:
		return e.Limit
	}
	return ""
}

// ConcurrencyRetryHint is the Retry-After given when the concurrency limit
// refuses a request: a slot frees when some reservation is settled,
// released or expires, which no clock can predict.
const ConcurrencyRetryHint = time.Second

// Debit takes an admitted request from s: its cost from the tokens and the
// token windows, one request, one open slot. The balance may go negative
// only through replay of decisions made without the store, and never below
// the debt floor (minus one capacity). It returns the effective change of
// the token balance, or an *OverflowError (ErrOverflow) with s unchanged.
func (s *TenantState) Debit(cost int64) (int64, error) { return s.DebitExcept(Amount{Cost: cost}, 0) }

// DebitExcept is Debit of a (money windows count a.Money), leaving out the
// limits in skip: shadow limits that would have refused the request. A
// shadow limit's state is what it would be if it were enforced, so that
// turning enforcement on changes nothing but the answers, and its would-be
// refusals count what it would refuse. period_budget in skip leaves out
// every window.
func (s *TenantState) DebitExcept(a Amount, skip LimitSet) (int64, error) {
	if a.Cost < 0 || a.Money < 0 {
		return 0, &OverflowError{Field: "cost", Op: "a negative cost"}
	}
	need, err := micro("cost", a.Cost)
	if err != nil {
		return 0, err
	}
	used, err := s.windowsAfter(func(w WindowLimit, u WindowUsage) (int64, error) {
		return AddMicro("period_used", u.Used, a.of(w))
	}, skip)
	if err != nil {
		return 0, err
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
	s.setUsed(used)
	return applied, nil
}

// windowsAfter computes every window's usage after a change (f of each
// window not skipped; a skipped one keeps its own), without changing s, so
// that an overflow in any window leaves s as it was.
func (s *TenantState) windowsAfter(f func(WindowLimit, WindowUsage) (int64, error), skip LimitSet) ([]int64, error) {
	if len(s.Limits.Windows) == 0 {
		return nil, nil
	}
	used := make([]int64, len(s.Limits.Windows))
	for i, w := range s.Limits.Windows {
		u := WindowUsage{}
		if i < len(s.Windows) {
			u = s.Windows[i]
		}
		used[i] = u.Used
		if skip.Has(LimitPeriodBudget) {
			continue
		}
		n, err := f(w, u)
		if err != nil {
			return nil, err
		}
		used[i] = n
	}
	return used, nil
}

func (s *TenantState) setUsed(used []int64) {
	for i := range used {
		if i < len(s.Windows) {
			s.Windows[i].Used = used[i]
		}
	}
}

// Undebit gives back a Debit that was never made durable (a local decision
// its journal refused): applied is what the Debit returned.
func (s *TenantState) Undebit(cost, applied int64) {
	s.Tokens.BalanceMicro -= applied
	if s.Requests.CapacityMicro > 0 {
		s.Requests.BalanceMicro += Micro
	}
	s.Open--
	for i, w := range s.Limits.Windows {
		if i < len(s.Windows) && w.Counts == CountTokens {
			s.Windows[i].Used -= cost
		}
	}
}

// End reconciles an admission that reserved estimate at createdAt with
// what it actually cost (0 for a release): it refunds estimate - actual,
// capped at capacity, or charges the excess, which may drive the balance
// negative down to the debt floor (minus one capacity), and frees the open
// slot unless expiry freed it already (late). Each window: an extra charge
// always counts against its current window; a refund only returns what was
// taken from it, so a reservation from a previous window refunds nothing
// there. It returns the effective change of the token balance, or an
// *OverflowError (ErrOverflow) with s unchanged.
func (s *TenantState) End(estimate, actual int64, createdAt time.Time, late bool) (int64, error) {
	return s.EndExcept(Amount{Cost: estimate}, Amount{Cost: actual}, createdAt, late, 0)
}

// EndExcept is End of an admission that reserved estimate and used actual
// (money windows count their Money), whose debit left out the limits in
// skip (DebitExcept): they get neither refund nor charge.
func (s *TenantState) EndExcept(estimate, actual Amount, createdAt time.Time, late bool, skip LimitSet) (int64, error) {
	return s.EndDebited(estimate, actual, nil, createdAt, late, skip)
}

// EndDebited is EndExcept of an admission whose debit took debitedMicro
// from the token balance (nil: its whole estimate): the balance gets back
// debitedMicro - actual, never what was not taken. A local admission
// replayed at the debt floor was debited less than its estimate (the debit
// stops there); refunding its whole estimate gave a tenant at the floor
// the difference, once per such admission (issue 36, item 4). Its
// windows were debited the whole estimate, and are corrected from it.
func (s *TenantState) EndDebited(estimate, actual Amount, debitedMicro *int64, createdAt time.Time, late bool, skip LimitSet) (int64, error) {
	if estimate.Cost < 0 || actual.Cost < 0 || estimate.Money < 0 || actual.Money < 0 || debitedMicro != nil && *debitedMicro < 0 {
		return 0, &OverflowError{Field: "cost", Op: "a negative cost"}
	}
	diff := actual.Cost - estimate.Cost // both non-negative: cannot overflow
	refund, err := micro("cost", -diff)
	if err != nil {
		return 0, err
	}
	if debitedMicro != nil {
		used, err := micro("cost", actual.Cost)
		if err != nil {
			return 0, err
		}
		refund = *debitedMicro - used // both non-negative: cannot overflow
	}
	used, err := s.windowsAfter(func(w WindowLimit, u WindowUsage) (int64, error) {
		d := actual.of(w) - estimate.of(w)
		switch {
		case d > 0:
			return AddMicro("period_used", u.Used, d)
		case u.Start != nil && !createdAt.Before(*u.Start):
			return max(0, u.Used+d), nil
		}
		return u.Used, nil
	}, skip)
	if err != nil {
		return 0, err
	}
	var applied int64
	if !skip.Has(LimitTokens) {
		applied = s.Tokens.Refund(refund)
	}
	if !late && !skip.Has(LimitConcurrency) {
		s.Open--
	}
	s.setUsed(used)
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
	// PeriodStart, PeriodEnd and PeriodUsed are the "period" window's
	// (zero without one), as period_budget showed them before windows.
	PeriodStart time.Time
	PeriodEnd   time.Time
	PeriodUsed  int64
	// Windows are every window's current span and usage.
	Windows   []WindowSnapshot
	LedgerSeq int64
	// Models is the tenant's own model scope (empty: every model), as
	// rule.CheckModelScopes reads it: a replica deciding on its own while
	// the store is down applies the last it saw.
	Models []string
}

// WindowSnapshot is one window at one instant: its span [Start, End) in
// the tenant's zone, and what it has used of its limit.
type WindowSnapshot struct {
	WindowLimit
	Start, End time.Time
	Used       int64
}

// Remaining is what the window has left below its limit (not counting the
// overage), never below zero.
func (w WindowSnapshot) Remaining() int64 { return max(0, w.Limit-w.Used) }

// Snapshot renders s at now for tenantID.
func (s TenantState) Snapshot(tenantID string, now time.Time) Snapshot {
	snap := Snapshot{
		TenantID:         tenantID,
		At:               now,
		Limits:           s.Limits,
		TokensMicro:      s.Tokens.BalanceMicro,
		TokensFullIn:     RoundUpMS(s.Tokens.TimeUntilFull()),
		OpenReservations: s.Open,
	}
	if s.Requests.CapacityMicro > 0 {
		snap.RequestsMicro = s.Requests.BalanceMicro
		snap.RequestsFullIn = RoundUpMS(s.Requests.TimeUntilFull())
	}
	for i, w := range s.Limits.Windows {
		if i >= len(s.Windows) || s.Windows[i].Start == nil {
			continue
		}
		ws := WindowSnapshot{WindowLimit: w, Start: *s.Windows[i].Start, End: w.Next(*s.Windows[i].Start), Used: s.Windows[i].Used}
		snap.Windows = append(snap.Windows, ws)
		if w.Name == PeriodWindowName {
			snap.PeriodStart, snap.PeriodEnd, snap.PeriodUsed = ws.Start, ws.End, ws.Used
		}
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
//
// A bucket that refill cannot fill within the range of a time.Duration
// (Never) has no reset header: no time can be promised, and the one a
// wrapped duration gave was negative.
func (s Snapshot) RateHeaders() []Header {
	h := []Header{
		{"X-Ratelimit-Limit-Tokens", strconv.FormatInt(s.Limits.TokensCapacity, 10)},
		{"X-Ratelimit-Remaining-Tokens", strconv.FormatInt(max(0, s.Tokens()), 10)},
	}
	if !Never(s.TokensFullIn) {
		h = append(h, Header{"X-Ratelimit-Reset-Tokens", s.TokensFullIn.String()})
	}
	if s.Limits.RequestsCapacity > 0 {
		h = append(h,
			Header{"X-Ratelimit-Limit-Requests", strconv.FormatInt(s.Limits.RequestsCapacity, 10)},
			Header{"X-Ratelimit-Remaining-Requests", strconv.FormatInt(max(0, s.Requests()), 10)})
		if !Never(s.RequestsFullIn) {
			h = append(h, Header{"X-Ratelimit-Reset-Requests", s.RequestsFullIn.String()})
		}
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
