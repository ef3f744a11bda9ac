package budget

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
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

// ReserveResult is the outcome of one request of a batch.
type ReserveResult struct {
	Reservation *Reservation
	Err         error
}

// Reserve admits one request or refuses it. It returns a *RejectedError
// (ErrRejected) when a limit refuses it, a *TooLargeError (ErrTooLarge) when
// it can never fit, ErrTenantNotFound, ErrTenantDisabled or
// ErrIdempotencyMismatch.
func (s *Store) Reserve(ctx context.Context, p ReserveParams) (*Reservation, error) {
	res, err := s.ReserveBatch(ctx, p.TenantID, []ReserveParams{p})
	if err != nil {
		return nil, err
	}
	return res[0].Reservation, res[0].Err
}

// ReserveBatch decides several requests of one tenant under one lock and
// one commit, in order: each sees the balances the earlier ones left. The
// returned error is for the whole batch (tenant missing, database); each
// result carries its own decision.
func (s *Store) ReserveBatch(ctx context.Context, tenantID string, ps []ReserveParams) ([]ReserveResult, error) {
	var res []ReserveResult
	err := retry(ctx, func() error {
		var err error
		res, err = s.reserveBatchOnce(ctx, tenantID, ps)
		return err
	})
	return res, err
}

func (s *Store) reserveBatchOnce(ctx context.Context, tenantID string, ps []ReserveParams) ([]ReserveResult, error) {
	type prior struct {
		admissionID string
		hash        []byte
		response    []byte
	}
	priors := make([]*prior, len(ps))
	tx, t, now, err := s.lockTenant(ctx, tenantID,
		func(b *pgx.Batch) {
			for _, p := range ps {
				if p.IdempotencyKey != "" {
					b.Queue(idempotencyGetSQL, tenantID, p.IdempotencyKey)
				}
			}
		},
		func(br pgx.BatchResults) error {
			for i, p := range ps {
				if p.IdempotencyKey == "" {
					continue
				}
				var pr prior
				err := br.QueryRow().Scan(&pr.admissionID, &pr.hash, &pr.response)
				if errors.Is(err, pgx.ErrNoRows) {
					continue
				}
				if err != nil {
					return fmt.Errorf("budget: idempotency key: %w", err)
				}
				priors[i] = &pr
			}
			return nil
		})
	if err != nil {
		return nil, err
	}

	results := make([]ReserveResult, len(ps))
	if t.disabled {
		tx.abort()
		for i := range results {
			results[i].Err = ErrTenantDisabled
		}
		return results, nil
	}
	t.advance(now)

	writes := &pgx.Batch{}
	var entries []*ledger.Entry
	fresh := map[string]int{} // idempotency key -> index admitted in this batch
	for i, p := range ps {
		if p.IdempotencyKey != "" {
			var pr *prior
			if j, ok := fresh[p.IdempotencyKey]; ok {
				pr = &prior{hash: ps[j].RequestHash}
				results[i] = ReserveResult{Reservation: replayOf(results[j].Reservation)}
			} else if priors[i] != nil {
				pr = priors[i]
				var r Reservation
				if err := json.Unmarshal(pr.response, &r); err != nil {
					results[i].Err = fmt.Errorf("budget: stored idempotent response: %w", err)
					continue
				}
				r.Replayed = true
				results[i] = ReserveResult{Reservation: &r}
			}
			if pr != nil {
				if !bytes.Equal(pr.hash, p.RequestHash) {
					results[i] = ReserveResult{Err: ErrIdempotencyMismatch}
				}
				continue
			}
		}
		cost := p.Estimate.Cost
		if err := t.admissible(cost, now); err != nil {
			results[i].Err = err
			continue
		}

		a := &Admission{
			ID:        newAdmissionID(now),
			TenantID:  t.id,
			State:     StateReserved,
			Estimate:  p.Estimate,
			CreatedAt: now,
			ExpiresAt: now.Add(t.limits.ReservationTTL),
		}
		t.tokens.BalanceMicro -= cost * Micro
		if t.requests.CapacityMicro > 0 {
			t.requests.BalanceMicro -= Micro
		}
		t.open++
		if t.limits.Period != PeriodNone {
			t.periodUsed += cost
		}

		e := t.entry(ledger.KindReserve, now, actorOr(p.Actor, "api"))
		e.AdmissionID, e.Model = a.ID, a.Estimate.Model
		e.Estimate = &cost
		e.DeltaMicro = -cost * Micro
		t.seal(e)
		entries = append(entries, e)

		r := &Reservation{AdmissionID: a.ID, Estimate: a.Estimate, CreatedAt: a.CreatedAt, ExpiresAt: a.ExpiresAt, Snapshot: t.snapshot(now)}
		results[i].Reservation = r
		est := &a.Estimate
		writes.Queue(admissionInsertSQL, a.ID, a.TenantID, est.Model, est.InputTokens, est.OutputTokens, est.Cost,
			est.Approximate, est.InputWeightMicro, est.OutputWeightMicro, a.CreatedAt, a.ExpiresAt)
		if p.IdempotencyKey != "" {
			stored, err := json.Marshal(r)
			if err != nil {
				tx.abort()
				return nil, fmt.Errorf("budget: encode reservation: %w", err)
			}
			writes.Queue(idempotencyPutSQL, t.id, p.IdempotencyKey, a.ID, p.RequestHash, stored, now)
			fresh[p.IdempotencyKey] = i
		}
	}
	// Rejections carry the balances as they stand after the whole batch.
	for i := range results {
		var rej *RejectedError
		if errors.As(results[i].Err, &rej) {
			rej.Snapshot = t.snapshot(now)
		}
	}
	if len(entries) == 0 {
		tx.abort() // nothing admitted: nothing to write, not even the refill
		return results, nil
	}
	// The tenant row first: the admissions' ledger rows follow it.
	tenantWrite := &pgx.Batch{}
	t.queueUpdate(tenantWrite)
	for _, e := range entries {
		ledger.QueueInsert(tenantWrite, e)
	}
	tenantWrite.QueuedQueries = append(tenantWrite.QueuedQueries, writes.QueuedQueries...)
	if err := tx.finish(ctx, tenantWrite); err != nil {
		return nil, err
	}
	return results, nil
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
