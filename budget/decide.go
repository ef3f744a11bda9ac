package budget

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/jackc/pgx/v5"
)

// Op is one request to decide in a tenant's batch: exactly one of its
// fields is set.
type Op struct {
	Reserve *ReserveParams
	Settle  *SettleParams
	Release *ReleaseParams
	Expire  *ExpireParams
}

// ExpireParams asks for a tenant's overdue reservations to be expired (at
// most sweepBatch of them): each stays charged at its estimate, frees its
// concurrency slot and gets an expire entry.
type ExpireParams struct {
	TenantID string
}

// keyID is the tenant key the request came with ("" for none).
func (op Op) keyID() string {
	switch {
	case op.Reserve != nil:
		return op.Reserve.KeyID
	case op.Settle != nil:
		return op.Settle.KeyID
	case op.Release != nil:
		return op.Release.KeyID
	}
	return ""
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
	Expired     int // for an Expire: how many reservations it expired
	Err         error
}

// Item is one request of a batch: an Op for a tenant.
type Item struct {
	TenantID string
	Op       Op
}

// Decide decides several requests of one tenant (reserves, settles and
// releases, in any mix) under one row lock and one commit, in order: each
// sees the balances the earlier ones left. It is DecideBatch for one tenant.
func (s *Store) Decide(ctx context.Context, tenantID string, ops []Op) ([]OpResult, error) {
	items := make([]Item, len(ops))
	for i, op := range ops {
		items[i] = Item{TenantID: tenantID, Op: op}
	}
	return s.DecideBatch(ctx, items)
}

// DecideBatch decides the requests of any tenants in one transaction: it
// locks every tenant row involved in one statement, in id order (so
// replicas whose batches overlap cannot deadlock), applies each tenant's
// requests first in, first out, each seeing the balances the previous one
// left, writes everything with one multi-row statement per table, and
// commits once. A tenant's row takes about 1 / (lock hold time)
// transactions a second, and a commit costs a WAL flush: deciding whatever
// queued while the previous transaction ran is what lets tokengate go
// faster than either.
//
// One tenant's refusal, missing row, conflict or bad write never fails
// another's request: refusals are results, and if the batch's writes fail
// for a reason other than the store (an SQL error), each tenant's requests
// are decided again in a transaction of its own, so that only the tenant
// at fault fails. The returned error is for the whole batch (ErrBusy,
// ErrUnavailable, ErrOutcomeUnknown); each result carries its own decision.
func (s *Store) DecideBatch(ctx context.Context, items []Item) ([]OpResult, error) {
	var res []OpResult
	err := retry(ctx, func() error {
		var err error
		res, err = s.decideOnce(ctx, items)
		return err
	})
	if err == nil || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrBusy) || ctx.Err() != nil {
		return res, err
	}
	tenants := map[string][]int{}
	var order []string
	for i, it := range items {
		if _, ok := tenants[it.TenantID]; !ok {
			order = append(order, it.TenantID)
		}
		tenants[it.TenantID] = append(tenants[it.TenantID], i)
	}
	if len(order) == 1 {
		return nil, err
	}
	// Isolate the failure: each tenant on its own.
	res = make([]OpResult, len(items))
	for _, id := range order {
		idx := tenants[id]
		sub := make([]Item, len(idx))
		for j, i := range idx {
			sub[j] = items[i]
		}
		var part []OpResult
		perr := retry(ctx, func() error {
			var err error
			part, err = s.decideOnce(ctx, sub)
			return err
		})
		for j, i := range idx {
			if perr != nil {
				res[i] = OpResult{Err: perr}
			} else {
				res[i] = part[j]
			}
		}
	}
	return res, nil
}

// decideOne is Decide for one request, with its error as the error.
func (s *Store) decideOne(ctx context.Context, tenantID string, op Op) (OpResult, error) {
	res, err := s.Decide(ctx, tenantID, []Op{op})
	if err != nil {
		return OpResult{}, err
	}
	return res[0], res[0].Err
}

func (s *Store) decideOnce(ctx context.Context, items []Item) ([]OpResult, error) {
	var ids, admIDs, keyTenants, keys, keyIDs, expiring, modelKeys []string
	seenT, seenA, seenK, seenC := map[string]bool{}, map[string]bool{}, map[[2]string]bool{}, map[string]bool{}
	for _, it := range items {
		if it.Op.Expire != nil && !slices.Contains(expiring, it.TenantID) {
			expiring = append(expiring, it.TenantID)
		}
		if id := it.Op.keyID(); id != "" && !seenC[id] {
			seenC[id] = true
			keyIDs = append(keyIDs, id)
		}
		if !seenT[it.TenantID] {
			seenT[it.TenantID] = true
			ids = append(ids, it.TenantID)
		}
		if id := it.Op.admissionID(); id != "" && !seenA[id] {
			seenA[id] = true
			admIDs = append(admIDs, id)
		}
		if r := it.Op.Reserve; r != nil {
			if k := ModelKey(r.Estimate); !slices.Contains(modelKeys, k) {
				modelKeys = append(modelKeys, k)
			}
		}
		if r := it.Op.Reserve; r != nil && r.IdempotencyKey != "" && !seenK[[2]string{it.TenantID, r.IdempotencyKey}] {
			seenK[[2]string{it.TenantID, r.IdempotencyKey}] = true
			keyTenants, keys = append(keyTenants, it.TenantID), append(keys, r.IdempotencyKey)
		}
	}
	sort.Strings(ids)
	sort.Strings(admIDs)
	sort.Strings(expiring)
	// Pools cost nothing where there are none: their statements are queued
	// only when some model draws on a pool.
	routes, err := s.poolRoutes(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.periodAlertRules(ctx); err != nil {
		return nil, err
	}
	var poolIDs []string
	for _, k := range modelKeys {
		if id, ok := routes[k]; ok && !slices.Contains(poolIDs, id) {
			poolIDs = append(poolIDs, id)
		}
	}
	usePools := len(poolIDs) > 0 || len(routes) > 0 && len(admIDs) > 0
	priors := map[[2]string]*prior{}
	adms := map[string]*Admission{}
	liveKeys := map[string]string{} // unrevoked key id -> its tenant
	overdue := map[string][]*Admission{}
	var models map[[2]string]*modelBucket
	var pools map[string]*pool
	queueModels := s.modelQueue(ids)
	keyPriority := map[string]Priority{}
	tx, ts, now, err := s.lockTenants(ctx, ids,
		func(b *pgx.Batch) {
			if queueModels {
				b.Queue(modelLimitsLockSQL, ids)
			}
			if len(keyIDs) > 0 {
				b.Queue(keyLiveSQL, keyIDs)
			}
			if len(keys) > 0 {
				b.Queue(idempotencyGetSQL, keyTenants, keys, s.clock())
			}
			if len(admIDs) > 0 {
				b.Queue(admissionLockSQL, admIDs)
			}
			if len(expiring) > 0 {
				b.Queue(admissionExpiredLockSQL, expiring, sweepBatch, s.clock())
			}
			if usePools {
				queuePools(b, poolIDs, admIDs)
			}
		},
		func(br pgx.BatchResults) error {
			if queueModels {
				var err error
				if models, err = scanModelBuckets(br.Query()); err != nil {
					return err
				}
			}
			if len(keyIDs) > 0 {
				rows, err := br.Query()
				if err != nil {
					return fmt.Errorf("budget: keys: %w", err)
				}
				var id, tenantID, priority string
				if _, err := pgx.ForEachRow(rows, []any{&id, &tenantID, &priority}, func() error {
					liveKeys[id] = tenantID
					keyPriority[id] = Priority(priority)
					return nil
				}); err != nil {
					return fmt.Errorf("budget: keys: %w", err)
				}
			}
			if len(keys) > 0 {
				rows, err := br.Query()
				if err != nil {
					return fmt.Errorf("budget: idempotency keys: %w", err)
				}
				var tenantID, key string
				var pr prior
				_, err = pgx.ForEachRow(rows, []any{&tenantID, &key, &pr.admissionID, &pr.hash, &pr.response}, func() error {
					p := pr
					priors[[2]string{tenantID, key}] = &p
					return nil
				})
				if err != nil {
					return fmt.Errorf("budget: idempotency keys: %w", err)
				}
			}
			if len(admIDs) > 0 {
				as, err := scanAdmissions(br.Query())
				if err != nil {
					return err
				}
				for _, a := range as {
					adms[a.ID] = a
				}
			}
			if len(expiring) > 0 {
				as, err := scanAdmissions(br.Query())
				if err != nil {
					return err
				}
				for _, a := range as {
					overdue[a.TenantID] = append(overdue[a.TenantID], a)
				}
			}
			if usePools {
				var err error
				if pools, err = scanPools(br); err != nil {
					return err
				}
			}
			return nil
		})
	if err != nil {
		return nil, err
	}

	have := modelTenantsOf(ids, ts)
	for _, id := range have {
		s.modelTenants.Store(id, true)
	}
	if !queueModels && len(have) > 0 {
		var err error
		if models, err = tx.readModelsLate(ctx, have); err != nil {
			tx.abort()
			return nil, err
		}
	}
	if queueModels && len(have) < len(ids) { // limits removed since: stop reading them
		for _, id := range ids {
			if !slices.Contains(have, id) {
				s.modelTenants.Delete(id)
			}
		}
	}
	for _, m := range models {
		m.advance(now)
	}
	var late []string
	for _, a := range adms {
		if a.PoolID != "" && pools[a.PoolID] == nil && !slices.Contains(late, a.PoolID) {
			late = append(late, a.PoolID)
		}
	}
	if len(late) > 0 {
		if pools == nil {
			pools = map[string]*pool{}
		}
		sort.Strings(late)
		if err := tx.lockPoolsLate(ctx, late, pools); err != nil {
			tx.abort()
			return nil, err
		}
	}
	for _, p := range pools {
		p.Tokens.Refill(now)
	}
	w := &writes{pools: pools}
	table := s.modelTable()
	decisions := map[string]*decision{}
	advanced := map[*tenant]bool{} // an ancestor may be shared by several tenants of the batch
	results := make([]OpResult, len(items))
	for i, it := range items {
		t, ok := ts[it.TenantID]
		if !ok {
			results[i].Err = ErrTenantNotFound
			continue
		}
		d := decisions[it.TenantID]
		if d == nil {
			chain, err := chainOf(ts, t)
			if err != nil {
				tx.abort()
				return nil, err
			}
			for _, lv := range chain {
				if !advanced[lv] {
					advanced[lv] = true
					lv.advance(now)
				}
			}
			d = &decision{t: t, chain: chain, models: models, pools: pools, routes: routes, now: now, w: w, adms: map[string]*Admission{}, fresh: map[string]*freshKey{},
				table: table}
			decisions[it.TenantID] = d
		}
		op := it.Op
		if k := op.keyID(); k != "" {
			switch {
			case liveKeys[k] != it.TenantID:
				results[i].Err = ErrKeyRevoked
				continue
			case anyDisabled(d.chain):
				results[i].Err = ErrTenantDisabled // as authenticating the key would have said
				continue
			}
		}
		switch {
		case op.Reserve != nil:
			rp := *op.Reserve
			if pr, ok := keyPriority[rp.KeyID]; ok {
				rp.Priority = pr
			}
			results[i].Reservation, results[i].Err = d.reserve(rp, priors[[2]string{it.TenantID, op.Reserve.IdempotencyKey}])
		case op.Settle != nil:
			p := op.Settle
			results[i].Settlement, results[i].Err = d.end(adms, p.AdmissionID, p.Actor, StateSettled, p.InputTokens, p.OutputTokens, true)
		case op.Release != nil:
			p := op.Release
			results[i].Settlement, results[i].Err = d.end(adms, p.AdmissionID, p.Actor, StateReleased, 0, 0, false)
		case op.Expire != nil:
			results[i].Expired = d.expire(overdue[it.TenantID])
			overdue[it.TenantID] = nil // a second Expire in the batch finds them done
		default:
			results[i].Err = errors.New("budget: an Op with nothing to decide")
		}
		if results[i].Err != nil && !isDecision(results[i].Err) {
			tx.abort()
			return nil, results[i].Err
		}
	}
	// Rejections carry the balances as they stand after the whole batch,
	// of the level whose limit refused.
	for i, it := range items {
		var rej *RejectedError
		if errors.As(results[i].Err, &rej) {
			lv := ts[it.TenantID]
			if l, ok := ts[rej.Level]; ok {
				lv = l
			}
			rej.Snapshot = lv.snapshot(now)
		}
	}
	// Nothing changed: nothing is written, not even the refill.
	if err := tx.commit(ctx, w); err != nil {
		return nil, err
	}
	return results, nil
}

// isDecision tells a request's own outcome (refused, unknown admission,
// conflict) from a failure of the whole batch.
func isDecision(err error) bool {
	return errors.Is(err, ErrRejected) || errors.Is(err, ErrTooLarge) || errors.Is(err, ErrTenantDisabled) ||
		errors.Is(err, ErrIdempotencyMismatch) || errors.Is(err, ErrAdmissionNotFound) || errors.Is(err, ErrConflict) ||
		errors.Is(err, ErrTenantNotFound) || errors.Is(err, ErrKeyRevoked) || errors.Is(err, ErrUsageOutOfBounds)
}
