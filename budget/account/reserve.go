package account

import (
	"context"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
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
	// ReplayNow keeps no answer for the key: a retry is answered with the
	// admission's id and the tenant's balances as they are then, instead
	// of the first answer byte for byte. For a face whose answer is only
	// "admitted" and the balances (the rate limit service): the ~700 bytes
	// an answer takes were a third of what a keyed admission wrote and
	// allocated.
	ReplayNow bool
	Actor     string
	// KeyID is the tenant key the request came with, if any: the decision
	// checks in its own transaction that it is not revoked (ErrKeyRevoked),
	// so that authenticating a request needs no query of its own.
	KeyID string
	// GatewayID is the gateway credential the request came through, if any
	// (a gateway asks on behalf of many tenants): the decision checks in
	// its own transaction that it is not revoked (ErrGatewayRevoked) and
	// that its scope holds TenantID (ErrOutOfScope, GatewayMay), so that a
	// gateway's call needs no query of its own either. Nothing is debited
	// when it refuses.
	GatewayID string
	// HoldbackMicro is what the decision must leave in the token bucket:
	// what callers queued ahead of this one in its replica wait for, so
	// that a large request waiting for refill is not starved by smaller
	// ones behind it (budget/admission sets it).
	HoldbackMicro int64
	// PoolHoldbackMicro is what the decision must leave in the upstream
	// pool the request's model draws on: what the requests this replica
	// holds waiting for the pool, and would serve before this one (by
	// priority class, then virtual token counter), need.
	PoolHoldbackMicro int64
	// PoolBacklogged says the request's tenant has callers waiting for the
	// pool in its replica (or the replica cannot tell): it was not idle,
	// whatever the pool's counters say, so it is not lifted to the floor of
	// the tenants served meanwhile, only to one bucket below it.
	PoolBacklogged bool
	// Priority is the class of the request's key; the decision fills it in
	// from the key's row (KeyID), and reports it back.
	Priority rule.Priority
	// Face is the face the request came through ("" is FaceAPI): the
	// admission remembers it, only it may end the admission, and
	// IdempotencyKey lives in its namespace (Face.StoredKey). The
	// admission layer sets it from the face that called it.
	Face rule.Face
}

// Reservation is an admitted request: the admission and the tenant's
// balances right after it.
type Reservation struct {
	AdmissionID string             `json:"admission_id"`
	Estimate    estimator.Estimate `json:"estimate"`
	CreatedAt   time.Time          `json:"created_at"`
	ExpiresAt   time.Time          `json:"expires_at"`
	Snapshot    rule.Snapshot      `json:"snapshot"`
	// Shadow are the shadow limits that would have refused it (not kept
	// for an idempotent replay, which is not a decision).
	Shadow []rule.ShadowRefusal `json:"-"`
	// Pool is the upstream pool the admission drew on, as it left it, and
	// Priority the class of the request's key.
	Pool     *rule.PoolState `json:"-"`
	Priority rule.Priority   `json:"-"`
	// Replayed is true when an idempotent retry returned an earlier
	// admission.
	Replayed bool `json:"-"`
}

// Reserve admits one request or refuses it. It returns a *RejectedError
// (ErrRejected) when a limit refuses it, a *TooLargeError (ErrTooLarge) when
// it can never fit, ErrTenantNotFound, ErrTenantDisabled,
// ErrIdempotencyMismatch, ErrKeyRevoked, ErrGatewayRevoked or
// ErrOutOfScope.
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
