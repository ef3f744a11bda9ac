package budget

import (
	"context"
	"time"

	"github.com/tokengate/tokengate/estimator"
)

// ReserveParams is one request to admit.
type ReserveParams struct {
	TenantID string
	// Estimate is the request's estimate; its Cost is what is reserved.
	Estimate estimator.Estimate
	// IdempotencyKey, when set, makes a retry within 24 h return the
	// original admission instead of debiting again. RequestHash fingerprints
	// the request so a reused key with a different request is refused.
	IdempotencyKey string
	RequestHash    []byte
	Actor          string
}

// Reservation is an admitted request: the admission and the tenant's
// balances right after it.
type Reservation struct {
	AdmissionID string             `json:"admission_id"`
	Estimate    estimator.Estimate `json:"estimate"`
	CreatedAt   time.Time          `json:"created_at"`
	ExpiresAt   time.Time          `json:"expires_at"`
	Snapshot    Snapshot           `json:"snapshot"`
	// Replayed is true when an idempotent retry returned an earlier
	// admission.
	Replayed bool `json:"-"`
}

// Reserve admits one request or refuses it. It returns a *RejectedError
// (ErrRejected) when a limit refuses it, a *TooLargeError (ErrTooLarge) when
// it can never fit, ErrTenantNotFound, ErrTenantDisabled or
// ErrIdempotencyMismatch.
func (s *Store) Reserve(ctx context.Context, p ReserveParams) (*Reservation, error) {
	r, err := s.decideOne(ctx, p.TenantID, Op{Reserve: &p})
	return r.Reservation, err
}

func replayOf(r *Reservation) *Reservation {
	if r == nil {
		return nil
	}
	c := *r
	c.Replayed = true
	return &c
}

func actorOr(actor, fallback string) string {
	if actor == "" {
		return fallback
	}
	return actor
}

// admissible checks every configured limit, in the documented order, for a
// request of cost at now (balances already advanced). It returns nil, a
// *TooLargeError or a *RejectedError; it changes nothing.
func (t *tenant) admissible(cost int64, now time.Time) error {
	if cost > t.limits.TokensCapacity {
		return &TooLargeError{Limit: LimitTokens, Cost: cost, Capacity: t.limits.TokensCapacity}
	}
	if t.limits.PeriodBudget > 0 && cost > t.limits.PeriodBudget {
		return &TooLargeError{Limit: LimitPeriodBudget, Cost: cost, Capacity: t.limits.PeriodBudget}
	}
	if need := cost * Micro; need > t.tokens.BalanceMicro {
		return &RejectedError{Limit: LimitTokens, RetryAfter: roundUpMS(t.tokens.TimeUntil(need))}
	}
	if t.requests.CapacityMicro > 0 && t.requests.BalanceMicro < Micro {
		return &RejectedError{Limit: LimitRequests, RetryAfter: roundUpMS(t.requests.TimeUntil(Micro))}
	}
	if t.limits.MaxConcurrent > 0 && t.open >= t.limits.MaxConcurrent {
		return &RejectedError{Limit: LimitConcurrency, RetryAfter: ConcurrencyRetryHint}
	}
	if t.limits.PeriodBudget > 0 && t.periodUsed+cost > t.limits.PeriodBudget {
		return &RejectedError{Limit: LimitPeriodBudget, RetryAfter: roundUpMS(t.limits.Period.next(*t.periodStart).Sub(now))}
	}
	return nil
}

// ConcurrencyRetryHint is the Retry-After given when the concurrency limit
// refuses a request: a slot frees when some reservation is settled,
// released or expires, which no clock can predict.
const ConcurrencyRetryHint = time.Second
