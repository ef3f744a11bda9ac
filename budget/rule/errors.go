package rule

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Functions document which they return; api maps each to
// one HTTP status in one place.
var (
	// ErrTenantNotFound: no tenant has that id.
	ErrTenantNotFound = errors.New("budget: tenant not found")
	// ErrTenantExists: CreateTenant found the id taken.
	ErrTenantExists = errors.New("budget: tenant already exists")
	// ErrTenantDisabled: the tenant exists but may not be admitted.
	ErrTenantDisabled = errors.New("budget: tenant disabled")
	// ErrAdmissionNotFound: no admission of this tenant has that id.
	ErrAdmissionNotFound = errors.New("budget: admission not found")
	// ErrRejected is wrapped by *RejectedError: a limit refused the request.
	ErrRejected = errors.New("budget: rejected")
	// ErrTooLarge is wrapped by *TooLargeError: the cost exceeds a capacity,
	// so the request can never be admitted.
	ErrTooLarge = errors.New("budget: request too large")
	// ErrConflict: a settle or release contradicts the admission's state
	// (settled with different usage, or settled after release).
	ErrConflict = errors.New("budget: conflicts with the admission's state")
	// ErrIdempotencyMismatch: an Idempotency-Key was reused for a different
	// request within 24 h.
	ErrIdempotencyMismatch = errors.New("budget: idempotency key reused with a different request")
	// ErrKeyRevoked: the tenant key a request came with was revoked (found
	// by the decision's own transaction).
	ErrKeyRevoked = errors.New("budget: the request's key is revoked")
	// ErrGatewayRevoked: the gateway a request came through
	// (ReserveParams.GatewayID and the like) is revoked or unknown, found by
	// the decision's own transaction: a revocation applies to every replica
	// at once, without a query of its own per call.
	ErrGatewayRevoked = errors.New("budget: the request's gateway is revoked or unknown")
	// ErrOutOfScope: the gateway a request came through may not ask on
	// behalf of the request's tenant (GatewayMay).
	ErrOutOfScope = errors.New("budget: the tenant is outside the gateway's scope")
	// ErrNotReplayed: the admission was made by a replica on its own during
	// a store outage, and that replica has not replayed it into the store
	// yet. Retrying soon succeeds.
	ErrNotReplayed = errors.New("budget: admission made during an outage, not replayed into the store yet")
	// ErrInvalidLimits is wrapped by *LimitError.
	ErrInvalidLimits = errors.New("budget: invalid limits")
	// ErrBudgetExhausted is wrapped by *BudgetExhaustedError: a calendar
	// window (of tokens or money) has no room left for the request until
	// it resets. It is a refusal (errors.Is ErrRejected too), told apart
	// from a rate limit: waiting for a bucket to refill will not help.
	ErrBudgetExhausted = errors.New("budget: budget window exhausted")
)

// Limit names one of a tenant's limits, as the API reports it.
type Limit string

// The limits, in the order they are checked.
const (
	LimitTokens       Limit = "tokens"
	LimitRequests     Limit = "requests"
	LimitConcurrency  Limit = "concurrency"
	LimitPeriodBudget Limit = "period_budget"
)

// RejectedError says which limit refused a request and when retrying can
// succeed.
type RejectedError struct {
	Limit Limit
	// Level is the tenant whose limit refused: the caller's own, or one of
	// its ancestors when budgets nest ("" from a decision without a tree).
	Level string
	// Model is the model whose limits refused (input_tokens, output_tokens).
	Model string
	// Window names the window that refused (limit period_budget): its
	// RetryAfter is the exact time to that window's reset.
	Window string
	// Pool is the upstream pool that refused (limit pool), and PoolState
	// its balance and counters as the decision saw them.
	Pool      string
	PoolState *PoolState
	// Priority is the class of the request's key.
	Priority Priority
	// RetryAfter is the exact time until the deficit refills (tokens,
	// requests), until the next period (period_budget), or a hint
	// (concurrency, which frees when some reservation ends). NeverRefills
	// (Never reports it) is a refill too slow to end within the range of a
	// time.Duration: only a refund or a change of the limits makes room.
	RetryAfter time.Duration
	Snapshot   Snapshot
	// Shadow are the shadow limits that would have refused it too.
	Shadow []ShadowRefusal
}

func (e *RejectedError) Error() string {
	lim := e.Named()
	if e.Level != "" {
		return fmt.Sprintf("budget: rejected by the %s limit of %s; retry after %s", lim, e.Level, e.RetryAfter)
	}
	return fmt.Sprintf("budget: rejected by the %s limit; retry after %s", lim, e.RetryAfter)
}

// Unwrap makes errors.Is(err, ErrRejected) true.
func (e *RejectedError) Unwrap() error { return ErrRejected }

// Never reports whether refill cannot make room for the request in any
// useful time (NeverRefills): no Retry-After can be promised.
func (e *RejectedError) Never() bool { return Never(e.RetryAfter) }

// Named is the refusing limit as a message names it: "period_budget
// (window daily)" for a window.
func (e *RejectedError) Named() string {
	if e.Window != "" {
		return string(e.Limit) + " (window " + e.Window + ")"
	}
	return string(e.Limit)
}

// TooLargeError says which capacity a request's cost exceeds.
type TooLargeError struct {
	Limit Limit
	// Level is the tenant whose capacity it exceeds (see RejectedError).
	Level string
	// Model is the model whose limit it exceeds (input_tokens, output_tokens).
	Model string
	// Window names the window whose ceiling it exceeds (limit
	// period_budget), and Counts what that window counts: for money, Cost
	// and Capacity are micro-units of the currency.
	Window string
	Counts Counts
	// Pool is the upstream pool whose capacity it exceeds (limit pool).
	Pool     string
	Cost     int64
	Capacity int64
}

func (e *TooLargeError) Error() string {
	of := ""
	if e.Model != "" {
		of = " for " + e.Model
	}
	if e.Level != "" {
		of += " at " + e.Level
	}
	if e.Pool != "" {
		of += " of pool " + e.Pool
	}
	if e.Window != "" {
		if e.Counts == CountMoney {
			return fmt.Sprintf("request cost %s exceeds the ceiling of window %s (%s)%s, so it can never be admitted", FormatRate(e.Cost), e.Window, FormatRate(e.Capacity), of)
		}
		of += " of window " + e.Window
	}
	return fmt.Sprintf("request cost %d exceeds the %s capacity (%d)%s, so it can never be admitted", e.Cost, e.Limit, e.Capacity, of)
}

// Unwrap makes errors.Is(err, ErrTooLarge) true.
func (e *TooLargeError) Unwrap() error { return ErrTooLarge }

// LimitError names an invalid limit field.
type LimitError struct {
	Field  string
	Reason string
}

func (e *LimitError) Error() string { return "budget: " + e.Field + ": " + e.Reason }

// Unwrap makes errors.Is(err, ErrInvalidLimits) true.
func (e *LimitError) Unwrap() error { return ErrInvalidLimits }
