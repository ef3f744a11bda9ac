package budget

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

// Op is one request to decide in a tenant's batch: exactly one of its
// fields is set.
type Op struct {
	Reserve *ReserveParams
	Settle  *SettleParams
	Release *ReleaseParams
}

// admissionID is the admission a settle or release names ("" for a reserve).
func (op Op) admissionID() string {
	switch {
	case op.Settle != nil:
		return op.Settle.AdmissionID
	case op.Release != nil:
		return op.Release.AdmissionID
	}
	return ""
}

// OpResult is the decision on one Op: a Reservation for a reserve, a
// Settlement for a settle or release, or Err (a *RejectedError, a
// *TooLargeError, ErrTenantDisabled, ErrIdempotencyMismatch,
// ErrAdmissionNotFound or ErrConflict).
type OpResult struct {
	Reservation *Reservation
	Settlement  *Settlement
	Err         error
}

// Decide decides several requests of one tenant (reserves, settles and
// releases, in any mix) under one row lock and one commit, in order: each
// sees the balances the earlier ones left. A tenant's row takes about
// 1 / (lock hold time) transactions a second, so deciding what queued up
// while the previous transaction ran is what lets one hot tenant go faster
// than its row's commit rate. The returned error is for the whole batch
// (ErrTenantNotFound, ErrBusy, ErrUnavailable, ErrOutcomeUnknown); each
// result carries its own decision.
func (s *Store) Decide(ctx context.Context, tenantID string, ops []Op) ([]OpResult, error) {
	var res []OpResult
	err := retry(ctx, func() error {
		var err error
		res, err = s.decideOnce(ctx, tenantID, ops)
		return err
	})
	return res, err
}

// decideOne is Decide for one request, with its error as the error.
func (s *Store) decideOne(ctx context.Context, tenantID string, op Op) (OpResult, error) {
	res, err := s.Decide(ctx, tenantID, []Op{op})
	if err != nil {
		return OpResult{}, err
	}
	return res[0], res[0].Err
}

// prior is an Idempotency-Key's earlier admission.
type prior struct {
	admissionID string
	hash        []byte
	response    []byte
}

// decision is one batch being decided under the tenant's lock: the tenant
// as the batch has left it so far, and the writes queued.
type decision struct {
	t       *tenant
	now     time.Time
	entries []*ledger.Entry
	rows    *pgx.Batch            // admission inserts and ends, idempotency keys, in order
	adms    map[string]*Admission // admissions named by settles and releases, as the batch left them
	fresh   map[string]*freshKey  // idempotency keys admitted in this batch
}

type freshKey struct {
	hash []byte
	r    *Reservation
}

func (s *Store) decideOnce(ctx context.Context, tenantID string, ops []Op) ([]OpResult, error) {
	priors := make([]*prior, len(ops))
	var admIDs []string
	seen := map[string]bool{}
	for _, op := range ops {
		if id := op.admissionID(); id != "" && !seen[id] {
			seen[id] = true
			admIDs = append(admIDs, id)
		}
	}
	adms := make(map[string]*Admission, len(admIDs))
	tx, t, now, err := s.lockTenant(ctx, tenantID,
		func(b *pgx.Batch) {
			for _, op := range ops {
				if op.Reserve != nil && op.Reserve.IdempotencyKey != "" {
					b.Queue(idempotencyGetSQL, tenantID, op.Reserve.IdempotencyKey, s.clock())
				}
			}
			// Lock order: the tenant row (held), then its admission rows.
			for _, id := range admIDs {
				b.Queue(admissionLockSQL, id, tenantID)
			}
		},
		func(br pgx.BatchResults) error {
			for i, op := range ops {
				if op.Reserve == nil || op.Reserve.IdempotencyKey == "" {
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
			for _, id := range admIDs {
				a, err := scanAdmission(br.Query())
				if errors.Is(err, ErrAdmissionNotFound) {
					continue
				}
				if err != nil {
					return err
				}
				adms[id] = a
			}
			return nil
		})
	if err != nil {
		return nil, err
	}

	t.advance(now)
	d := &decision{t: t, now: now, rows: &pgx.Batch{}, adms: adms, fresh: map[string]*freshKey{}}
	results := make([]OpResult, len(ops))
	for i, op := range ops {
		switch {
		case op.Reserve != nil:
			results[i].Reservation, results[i].Err = d.reserve(*op.Reserve, priors[i])
		case op.Settle != nil:
			p := op.Settle
			results[i].Settlement, results[i].Err = d.end(p.AdmissionID, p.Actor, StateSettled, p.InputTokens, p.OutputTokens, true)
		case op.Release != nil:
			p := op.Release
			results[i].Settlement, results[i].Err = d.end(p.AdmissionID, p.Actor, StateReleased, 0, 0, false)
		default:
			results[i].Err = errors.New("budget: an Op with nothing to decide")
		}
		if results[i].Err != nil && !isDecision(results[i].Err) {
			tx.abort()
			return nil, results[i].Err
		}
	}
	// Rejections carry the balances as they stand after the whole batch.
	for i := range results {
		var rej *RejectedError
		if errors.As(results[i].Err, &rej) {
			rej.Snapshot = t.snapshot(now)
		}
	}
	if len(d.entries) == 0 {
		tx.abort() // nothing changed: nothing to write, not even the refill
		return results, nil
	}
	// The tenant row first, then the ledger, then the rows the entries name.
	writes := &pgx.Batch{}
	t.queueUpdate(writes)
	for _, e := range d.entries {
		ledger.QueueInsert(writes, e)
	}
	writes.QueuedQueries = append(writes.QueuedQueries, d.rows.QueuedQueries...)
	if err := tx.finish(ctx, writes); err != nil {
		return nil, err
	}
	return results, nil
}

// isDecision tells a request's own outcome (refused, unknown admission,
// conflict) from a failure of the whole batch.
func isDecision(err error) bool {
	return errors.Is(err, ErrRejected) || errors.Is(err, ErrTooLarge) || errors.Is(err, ErrTenantDisabled) ||
		errors.Is(err, ErrIdempotencyMismatch) || errors.Is(err, ErrAdmissionNotFound) || errors.Is(err, ErrConflict)
}

// reserve decides one admission: an idempotent retry returns the original,
// otherwise every limit is checked and the estimate debited.
func (d *decision) reserve(p ReserveParams, pr *prior) (*Reservation, error) {
	t, now := d.t, d.now
	if p.IdempotencyKey != "" {
		if f, ok := d.fresh[p.IdempotencyKey]; ok {
			if !bytes.Equal(f.hash, p.RequestHash) {
				return nil, ErrIdempotencyMismatch
			}
			return replayOf(f.r), nil
		}
		if pr != nil {
			if !bytes.Equal(pr.hash, p.RequestHash) {
				return nil, ErrIdempotencyMismatch
			}
			r, err := DecodeReservation(pr.response)
			if err != nil {
				return nil, err
			}
			r.Replayed = true
			return r, nil
		}
	}
	if t.disabled {
		return nil, ErrTenantDisabled
	}
	cost := p.Estimate.Cost
	if err := Decide(t.TenantState, cost, now); err != nil {
		return nil, err
	}

	a := &Admission{
		ID:        newAdmissionID(now),
		TenantID:  t.id,
		State:     StateReserved,
		Estimate:  p.Estimate,
		CreatedAt: now,
		ExpiresAt: now.Add(t.Limits.ReservationTTL),
	}
	t.Debit(cost)

	e := t.entry(ledger.KindReserve, now, actorOr(p.Actor, "api"))
	e.AdmissionID, e.Model = a.ID, a.Estimate.Model
	e.Estimate = &cost
	e.DeltaMicro = -cost * Micro
	t.seal(e)
	d.entries = append(d.entries, e)

	r := &Reservation{AdmissionID: a.ID, Estimate: a.Estimate, CreatedAt: a.CreatedAt, ExpiresAt: a.ExpiresAt, Snapshot: t.snapshot(now)}
	est := &a.Estimate
	d.rows.Queue(admissionInsertSQL, a.ID, a.TenantID, est.Model, est.InputTokens, est.OutputTokens, est.Cost,
		est.Approximate, est.InputWeightMicro, est.OutputWeightMicro, a.CreatedAt, a.ExpiresAt)
	if p.IdempotencyKey != "" {
		stored, err := EncodeReservation(r)
		if err != nil {
			return nil, err
		}
		d.rows.Queue(idempotencyPutSQL, t.id, p.IdempotencyKey, a.ID, p.RequestHash, stored, now)
		d.fresh[p.IdempotencyKey] = &freshKey{hash: p.RequestHash, r: r}
	}
	return r, nil
}

// end settles (usage set) or releases an admission: it refunds
// estimate - actual (capped at capacity) or charges the excess, frees the
// concurrency slot and appends the entry. Ending it again the same way
// returns the original answer; another way is ErrConflict. A settle of an
// expired admission still reconciles, marked late.
func (d *decision) end(admissionID, actor string, target State, in, out int64, usage bool) (*Settlement, error) {
	t, now := d.t, d.now
	a, ok := d.adms[admissionID]
	if !ok {
		return nil, ErrAdmissionNotFound
	}
	switch a.State {
	case StateSettled, StateReleased:
		same := a.State == target
		if same && usage {
			same = a.ActualInput != nil && *a.ActualInput == in && a.ActualOutput != nil && *a.ActualOutput == out
		}
		if !same {
			return nil, ErrConflict
		}
		return &Settlement{Admission: a, DeltaMicro: deref(a.EndDeltaMicro), BalanceMicro: deref(a.EndBalanceMicro),
			Snapshot: t.snapshot(now), Replayed: true}, nil
	}

	late := a.State == StateExpired
	actual := int64(0)
	if usage {
		actual = estimator.Cost(in, out, a.Estimate.InputWeightMicro, a.Estimate.OutputWeightMicro)
	}
	cost := a.Estimate.Cost
	applied := t.End(cost, actual, a.CreatedAt, late)

	kind := ledger.KindSettle
	if target == StateReleased {
		kind = ledger.KindRelease
	}
	e := t.entry(kind, now, actorOr(actor, "api"))
	e.AdmissionID, e.Model, e.Late = a.ID, a.Estimate.Model, late
	e.Estimate = &cost
	e.Actual = &actual
	e.DeltaMicro = applied
	t.seal(e)
	d.entries = append(d.entries, e)

	ended := *a
	ended.State, ended.Late = target, late
	ended.EndedAt = &now
	if usage {
		ended.ActualInput, ended.ActualOutput = &in, &out
	}
	ended.ActualCost = &actual
	balance := t.Tokens.BalanceMicro
	ended.EndDeltaMicro, ended.EndBalanceMicro = &applied, &balance
	d.adms[admissionID] = &ended
	queueAdmissionEnd(d.rows, &ended)
	return &Settlement{Admission: &ended, DeltaMicro: applied, BalanceMicro: balance, Snapshot: t.snapshot(now)}, nil
}
