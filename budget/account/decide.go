package account

import (
	"context"
	"errors"
	"slices"
	"strconv"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// Op is one request to decide in a tenant's batch: exactly one of its
// fields is set.
type Op struct {
	Reserve *ReserveParams
	Settle  *SettleParams
	Release *ReleaseParams
	Expire  *ExpireParams
	// invalid refuses the request before it is decided, and before
	// anything is read for it (namespaced).
	invalid error
	// answered is the request's outcome from an earlier try of its batch,
	// in which its group broke (group.go): it is not decided again.
	answered error
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

// gatewayID is the gateway the request came through ("" for none).
func (op Op) gatewayID() string {
	switch {
	case op.Reserve != nil:
		return op.Reserve.GatewayID
	case op.Settle != nil:
		return op.Settle.GatewayID
	case op.Release != nil:
		return op.Release.GatewayID
	}
	return ""
}

// admissionID is the admission a settle or release names by id ("" for a
// reserve, or one named by idempotency key).
func (op Op) admissionID() string {
	switch {
	case op.Settle != nil:
		return op.Settle.AdmissionID
	case op.Release != nil:
		return op.Release.AdmissionID
	}
	return ""
}

// admissionKey is the idempotency key a settle or release names its
// admission by ("" for a reserve, or one named by id).
func (op Op) admissionKey() string {
	switch {
	case op.Settle != nil:
		return op.Settle.IdempotencyKey
	case op.Release != nil:
		return op.Release.IdempotencyKey
	}
	return ""
}

// validate is the form of a settle's or release's parameters
// (SettleParams.Validate), and of its Idempotency-Key as its face sent it
// (namespaced), checked before anything is read of the state.
func (op Op) validate() error {
	if op.answered != nil {
		return op.answered
	}
	if op.invalid != nil {
		return op.invalid
	}
	switch {
	case op.Settle != nil:
		return op.Settle.Validate()
	case op.Release != nil:
		return op.Release.Validate()
	}
	return nil
}

// face is the face the request came through (FaceAPI for none).
func (op Op) face() rule.Face {
	switch {
	case op.Reserve != nil:
		return op.Reserve.Face.Or()
	case op.Settle != nil:
		return op.Settle.Face.Or()
	case op.Release != nil:
		return op.Release.Face.Or()
	}
	return rule.FaceAPI
}

// faceKey is the Idempotency-Key of a reserve, or the one a settle or
// release names its admission by, as its face sent it ("" for none).
func (op Op) faceKey() string {
	if op.Reserve != nil {
		return op.Reserve.IdempotencyKey
	}
	return op.admissionKey()
}

// namespaced returns items with every Idempotency-Key in its face's
// namespace (Face.StoredKey), as the decision reads and writes them, the
// params of those it changes copied (the caller's are not changed). A key
// whose form is wrong (IdempotencyKeyProblem: one with a space could name
// another face's) is not read: its request is refused (Op.invalid).
func namespaced(items []Item) []Item {
	var out []Item
	for i, it := range items {
		op := it.Op
		f := op.face()
		k := op.faceKey()
		if k == "" {
			continue
		}
		problem := rule.IdempotencyKeyProblem(k)
		if problem == "" && f == rule.FaceAPI {
			continue
		}
		if out == nil {
			out = slices.Clone(items)
		}
		if problem != "" {
			out[i].Op.invalid = &rule.InvalidError{Field: "Idempotency-Key", Reason: problem}
			continue
		}
		switch {
		case op.Reserve != nil:
			p := *op.Reserve
			p.IdempotencyKey = f.StoredKey(k)
			out[i].Op = Op{Reserve: &p}
		case op.Settle != nil:
			p := *op.Settle
			p.IdempotencyKey = f.StoredKey(k)
			out[i].Op = Op{Settle: &p}
		case op.Release != nil:
			p := *op.Release
			p.IdempotencyKey = f.StoredKey(k)
			out[i].Op = Op{Release: &p}
		}
	}
	if out == nil {
		return items
	}
	return out
}

// OpResult is the decision on one Op: a Reservation for a reserve, a
// Settlement for a settle or release, or Err (a *RejectedError, a
// *TooLargeError, ErrTenantNotFound, ErrTenantDisabled,
// ErrIdempotencyMismatch, ErrAdmissionNotFound, ErrConflict, a *UsageError,
// an *InvalidError, an *OtherFaceError, ErrKeyRevoked, ErrGatewayRevoked or
// ErrOutOfScope).
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
	// Group, when not 0, makes the reserves of the batch with the same
	// Group one decision, all or none: if any is not admitted, none is,
	// and each that would have been is answered a *rule.WithheldError
	// (Pipeline.ReserveAll, group.go).
	Group int
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
	items = namespaced(items)
	var res []OpResult
	err := retry(ctx, func() error {
		var err error
		res, err = s.decideOnce(ctx, items)
		return err
	})
	if err == nil || errors.Is(err, rule.ErrUnavailable) || errors.Is(err, rule.ErrBusy) || ctx.Err() != nil {
		return res, err
	}
	tenants := map[string][]int{} // by tenant, or by group: a group stays whole
	var order []string
	for i, it := range items {
		k := it.TenantID
		if it.Group != 0 {
			k = "\x00group" + strconv.Itoa(it.Group)
		}
		if _, ok := tenants[k]; !ok {
			order = append(order, k)
		}
		tenants[k] = append(tenants[k], i)
	}
	if len(order) == 1 {
		return nil, err
	}
	// Isolate the failure: each tenant (or group) on its own.
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

// decideOnce is one try of a batch, in three steps: load (lock the tenants
// and read everything the requests need, one round trip: load.go), decide
// (apply each request to the loaded state, no I/O: the rules, here and in
// decision.go), write (the batch's changes and COMMIT, one round trip:
// writes.go). Keeping the steps apart is what keeps the lock held for two
// round trips and no more: nothing in decide can wait on the database.
//
// A try that admitted part of a group (Item.Group) is rolled back, which
// undoes nothing since nothing was written, and the batch is decided again
// with the group answered by that try (withhold), until no group is broken:
// all or none. Each try answers at least one more group, so there are at
// most as many tries as groups, and a batch without a broken group never
// tries twice.
func (s *Store) decideOnce(ctx context.Context, items []Item) ([]OpResult, error) {
	for {
		l, err := s.load(ctx, items)
		if err != nil {
			return nil, err
		}
		results, w, err := l.decide(items, s.modelTable())
		if err != nil {
			l.tx.abort()
			return nil, err
		}
		if groups := broken(items, results); groups != nil {
			l.tx.abort()
			items = withhold(items, results, groups)
			continue
		}
		// Nothing changed: nothing is written, not even the refill.
		if err := l.tx.commit(ctx, w); err != nil {
			return nil, err
		}
		return results, nil
	}
}

// decide applies the batch's requests to the state l holds, in order, each
// seeing what the earlier ones left, and collects the writes. A request's
// own outcome (isDecision) is its result; any other error fails the whole
// batch, and the caller rolls back. table bounds and prices settles' usage
// (nil: the seeded table).
func (l *loaded) decide(items []Item, table *estimator.Table) ([]OpResult, *writes, error) {
	w := l.pre // the leases booked in the load step, if any
	if w == nil {
		w = &writes{}
	}
	w.pools = l.pools
	b := &batch{loaded: l, table: table, w: w, decisions: map[string]*decision{}, advanced: map[*tenant]bool{}}
	results := make([]OpResult, len(items))
	for i, it := range items {
		d, err := b.decisionFor(it)
		switch {
		case err != nil && !isDecision(err):
			return nil, nil, err
		case err != nil:
			results[i].Err = err
			continue
		}
		op := it.Op
		switch {
		case op.Reserve != nil:
			rp := *op.Reserve
			if k, ok := l.keys[rp.KeyID]; ok {
				rp.Priority = k.priority
			}
			results[i].Reservation, results[i].Err = d.reserve(rp, l.priors[[2]string{it.TenantID, rp.IdempotencyKey}])
		case op.Settle != nil:
			p := op.Settle
			results[i].Settlement, results[i].Err = d.end(l.adms, l.admissionOf(it, d), p.Actor, p.Face, StateSettled, p)
			if errors.Is(results[i].Err, rule.ErrAdmissionNotFound) {
				results[i].Err = d.deferEnd(p.IdempotencyKey, p.Defer, StateSettled, p.Actor, p.KeyID, p.GatewayID, p)
			}
		case op.Release != nil:
			p := op.Release
			results[i].Settlement, results[i].Err = d.end(l.adms, l.admissionOf(it, d), p.Actor, p.Face, StateReleased, nil)
			if errors.Is(results[i].Err, rule.ErrAdmissionNotFound) {
				results[i].Err = d.deferEnd(p.IdempotencyKey, p.Defer, StateReleased, p.Actor, p.KeyID, p.GatewayID, nil)
			}
		case op.Expire != nil:
			results[i].Expired = d.expire(l.overdue[it.TenantID])
			l.overdue[it.TenantID] = nil // a second Expire in the batch finds them done
		default:
			results[i].Err = errors.New("budget: an Op with nothing to decide")
		}
		if results[i].Err != nil && !isDecision(results[i].Err) {
			return nil, nil, results[i].Err
		}
	}
	// Rejections carry the balances as they stand after the whole batch,
	// of the level whose limit refused.
	for i, it := range items {
		var rej *rule.RejectedError
		var wh *rule.WithheldError
		switch {
		case errors.As(results[i].Err, &rej):
			lv := l.tenants[it.TenantID]
			if lvl, ok := l.tenants[rej.Level]; ok {
				lv = lvl
			}
			rej.Snapshot = lv.snapshot(l.now)
		case errors.As(results[i].Err, &wh):
			if lv, ok := l.tenants[it.TenantID]; ok {
				wh.Snapshot = lv.snapshot(l.now)
			}
		}
	}
	return results, b.w, nil
}

// batch is the decide step's own state over one batch.
type batch struct {
	*loaded
	table     *estimator.Table
	w         *writes
	decisions map[string]*decision // by tenant, made on its first request
	advanced  map[*tenant]bool     // levels brought to now (an ancestor may be shared by several tenants)
}

// decisionFor is the checks every request passes before its own rule, in
// order: its form (Validate), the gateway it came through (unrevoked, and
// its scope holding the tenant: checked before the tenant's existence, so
// that a gateway learns nothing of tenants outside its scope), the tenant,
// and the tenant key it came with (unrevoked, of this tenant, whose tree
// is not disabled). It returns the tenant's decision, made on its first
// request: its chain brought to now.
func (b *batch) decisionFor(it Item) (*decision, error) {
	op := it.Op
	if err := op.validate(); err != nil {
		return nil, err
	}
	if g := op.gatewayID(); g != "" {
		scope, ok := b.gws[g]
		switch {
		case !ok:
			return nil, rule.ErrGatewayRevoked
		case !rule.GatewayMay(scope, it.TenantID):
			return nil, rule.ErrOutOfScope
		}
	}
	t, ok := b.tenants[it.TenantID]
	if !ok {
		return nil, rule.ErrTenantNotFound
	}
	d := b.decisions[it.TenantID]
	if d == nil {
		chain, err := chainOf(b.tenants, t)
		if err != nil {
			return nil, err
		}
		for _, lv := range chain {
			if !b.advanced[lv] {
				b.advanced[lv] = true
				lv.advance(b.now)
			}
		}
		d = &decision{t: t, chain: chain, models: b.models, pools: b.pools, routes: b.routes, now: b.now, w: b.w,
			adms: map[string]*Admission{}, fresh: map[string]*freshKey{}, table: b.table, prices: b.prices}
		b.decisions[it.TenantID] = d
	}
	if op.Reserve != nil && t.endUserExpired {
		return nil, rule.ErrEndUserExpired // enduser.go: revived by EndUserEnsure, cap applies
	}
	if k := op.keyID(); k != "" {
		switch {
		case b.keys[k].tenantID != it.TenantID && (t.endUserOf == "" || b.keys[k].tenantID != t.endUserOf): // an end user decides with its tenant's keys
			return nil, rule.ErrKeyRevoked
		case anyDisabled(d.chain):
			return nil, rule.ErrTenantDisabled // as authenticating the key would have said
		}
	}
	if op.Reserve != nil {
		if err := checkScopes(d.chain, b.keys[op.keyID()].models, op.Reserve.Estimate.Model); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// admissionOf is the id of the admission a settle or release names: its
// AdmissionID; or the one its tenant's idempotency key named when the batch
// locked it, else the one a reserve earlier in this batch made with that
// key ("" for none: end answers ErrAdmissionNotFound).
func (l *loaded) admissionOf(it Item, d *decision) string {
	if id := it.Op.admissionID(); id != "" {
		return id
	}
	key := it.Op.admissionKey()
	if id, ok := l.named[[2]string{it.TenantID, key}]; ok {
		return id
	}
	if f, ok := d.fresh[key]; ok {
		return f.r.AdmissionID
	}
	return ""
}

// isDecision tells a request's own outcome (refused, unknown admission,
// conflict) from a failure of the whole batch.
func isDecision(err error) bool {
	return errors.Is(err, rule.ErrRejected) || errors.Is(err, rule.ErrTooLarge) || errors.Is(err, rule.ErrTenantDisabled) ||
		errors.Is(err, rule.ErrIdempotencyMismatch) || errors.Is(err, rule.ErrAdmissionNotFound) || errors.Is(err, rule.ErrConflict) ||
		errors.Is(err, rule.ErrTenantNotFound) || errors.Is(err, rule.ErrKeyRevoked) || errors.Is(err, rule.ErrUsageOutOfBounds) ||
		errors.Is(err, rule.ErrGatewayRevoked) || errors.Is(err, rule.ErrOutOfScope) || errors.As(err, new(*rule.InvalidError)) ||
		errors.Is(err, rule.ErrEndUserCap) || errors.Is(err, rule.ErrEndUserExpired) || errors.Is(err, rule.ErrOtherFace) ||
		errors.Is(err, rule.ErrWithheld) || errors.Is(err, rule.ErrModelNotAllowed)
}
