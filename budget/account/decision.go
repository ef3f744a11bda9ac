package account

import (
	"bytes"
	"errors"
	"slices"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

// prior is an Idempotency-Key's earlier admission.
type prior struct {
	admissionID string
	hash        []byte
	response    []byte
}

// decision is one tenant's part of a batch being decided under the locks:
// the tenant as the batch has left it so far, and the batch's writes.
type decision struct {
	t      *tenant
	chain  []*tenant                  // t's ancestors and t, root first
	models map[[2]string]*modelBucket // the batch's model buckets, by tenant and model
	pools  map[string]*rule.Pool      // the batch's pools, locked
	routes map[string]string          // model key -> pool id
	now    time.Time
	w      *writes
	adms   map[string]*Admission // admissions named by settles and releases, as the batch left them
	fresh  map[string]*freshKey  // idempotency keys admitted in this batch
	table  *estimator.Table      // bounds settles' usage (nil: the seeded table)
	prices *estimator.PriceBook  // prices admissions in money (nil: none)
	note   string                // added to the reason of the entries end appends ("" for none)
}

type freshKey struct {
	hash []byte
	r    *Reservation
}

// reserve decides one admission: an idempotent retry returns the original,
// otherwise every limit is checked and the estimate debited.
func (d *decision) reserve(p ReserveParams, pr *prior) (*Reservation, error) {
	t, now := d.t, d.now
	if p.IdempotencyKey != "" {
		if f, ok := d.fresh[p.IdempotencyKey]; ok {
			if !bytes.Equal(f.hash, p.RequestHash) {
				return nil, rule.ErrIdempotencyMismatch
			}
			return replayOf(f.r), nil
		}
		if pr != nil {
			if !bytes.Equal(pr.hash, p.RequestHash) {
				return nil, rule.ErrIdempotencyMismatch
			}
			if len(pr.response) == 0 { // kept with ReplayNow
				return &Reservation{AdmissionID: pr.admissionID, Snapshot: t.snapshot(now), Priority: p.Priority, Replayed: true}, nil
			}
			r, err := DecodeReservation(pr.response)
			if err != nil {
				return nil, err
			}
			r.Replayed = true
			return r, nil
		}
	}
	if anyDisabled(d.chain) {
		return nil, rule.ErrTenantDisabled
	}
	cost := p.Estimate.Cost
	mkey := ModelKey(p.Estimate)
	money, price, err := d.moneyOf(p.Estimate)
	if err != nil {
		return nil, err
	}
	skips, shadow, refusal := decideLevels(d.chain, p.Estimate, money, p.HoldbackMicro, now, d.models)
	var pl *rule.Pool
	if id, ok := d.routes[mkey]; ok {
		pl = d.pools[id]
	}
	poolNeed := p.Estimate.InputTokens + p.Estimate.OutputTokens
	if refusal == nil && pl != nil {
		refusal = pl.Refusal(poolNeed, p.PoolHoldbackMicro)
	}
	if refusal != nil {
		var rej *rule.RejectedError
		if errors.As(refusal, &rej) {
			rej.Priority, rej.Shadow = p.Priority, shadow
			if pl != nil {
				rej.PoolState = pl.State()
			}
		}
		if exh := (*rule.BudgetExhaustedError)(nil); errors.As(refusal, &exh) && exh.Counts == rule.CountMoney && price != nil {
			exh.Currency = price.Currency // the money was priced in it
		}
		return nil, refusal
	}

	a := &Admission{
		ID:        rule.NewStoreAdmissionID(now),
		TenantID:  t.id,
		State:     StateReserved,
		Estimate:  p.Estimate,
		CreatedAt: now,
		ExpiresAt: now.Add(t.Limits.ReservationTTL),
		Shadowed:  shadowedOf(d.chain, skips),
		Family:    mkey,
		Face:      p.Face.Or(),
	}
	a.priced(price, money)
	if pl != nil {
		a.PoolID = pl.ID
		pl.Serve(t.id, poolNeed, now, p.PoolBacklogged)
	}
	// Every level is debited, each with its own entry in its own chain.
	for i, lv := range d.chain {
		applied, err := lv.DebitExcept(rule.Amount{Cost: cost, Money: money}, skips[i])
		if err != nil {
			return nil, err // not a decision: the batch is aborted, nothing moves
		}
		e := lv.entry(ledger.KindReserve, now, actorOr(p.Actor, "api"))
		e.AdmissionID, e.Model = a.ID, a.Estimate.Model
		e.Estimate = &cost
		e.DeltaMicro = applied
		e.MoneyMicro = a.MoneyEstimate
		var detail []string
		if price != nil {
			if td := tierDetail(p.Estimate.ServiceTier, price.ServiceTier); td != "" {
				detail = append(detail, td)
			}
		}
		if m := d.models[[2]string{lv.id, mkey}]; m != nil {
			m.debit(p.Estimate.InputTokens, p.Estimate.OutputTokens, skips[i])
			d.w.model(m)
			a.ModelLevels = append(a.ModelLevels, lv.id)
			detail = append(detail, m.detail())
		}
		if pl != nil && lv == t {
			detail = append(detail, poolDetail(pl))
		}
		e.Detail = joinDetail(detail)
		e.Reason = shadowReason(skips[i])
		lv.seal(e)
		d.w.entry(lv, e)
	}
	d.w.inserted = append(d.w.inserted, a)
	d.adms[a.ID] = a // a settle later in the batch naming its key finds it

	r := &Reservation{AdmissionID: a.ID, Estimate: a.Estimate, CreatedAt: a.CreatedAt, ExpiresAt: a.ExpiresAt, Snapshot: t.snapshot(now), Shadow: shadow,
		Priority: p.Priority}
	if pl != nil {
		r.Pool = pl.State()
	}
	if p.IdempotencyKey != "" {
		stored := []byte{} // NOT NULL: empty is "replay now"
		if !p.ReplayNow {
			var err error
			if stored, err = EncodeReservation(r); err != nil {
				return nil, err
			}
		}
		d.w.keys = append(d.w.keys, keyPut{tenantID: t.id, key: p.IdempotencyKey, admissionID: a.ID, hash: p.RequestHash, response: stored, at: now})
		d.fresh[p.IdempotencyKey] = &freshKey{hash: p.RequestHash, r: r}
	}
	return r, nil
}

// end settles (usage set) or releases (usage nil) an admission: it refunds
// estimate - actual (capped at capacity, and at what its reserve debited:
// TenantState.EndDebited) or charges the excess, frees the
// concurrency slot and appends the entry. Ending it again the same way
// returns the original answer; another way is ErrConflict. A settle of an
// expired admission still reconciles, marked late. The usage charged is
// usage.Usage: refunds and cached input are priced with the admission,
// which is locked, so pricing costs no read. Only the face that made the
// admission may end it (*OtherFaceError), whatever its state, so that
// another face learns nothing of how it ended either.
func (d *decision) end(locked map[string]*Admission, admissionID, actor string, face rule.Face, target State, usage *SettleParams) (*Settlement, error) {
	t, now := d.t, d.now
	a, ok := d.adms[admissionID]
	if !ok {
		// As locked, unless it belongs to another tenant (then it is not
		// this caller's to see).
		if a, ok = locked[admissionID]; !ok || a.TenantID != t.id {
			return nil, rule.ErrAdmissionNotFound
		}
	}
	if a.Face.Or() != face.Or() {
		return nil, &rule.OtherFaceError{AdmissionID: a.ID, Face: a.Face.Or()}
	}
	var in, out int64
	if usage != nil {
		in, out = usage.Usage(a.Estimate, d.table)
	}

	switch a.State {
	case StateSettled, StateReleased:
		same := a.State == target
		if same && usage != nil {
			same = a.ActualInput != nil && *a.ActualInput == in && a.ActualOutput != nil && *a.ActualOutput == out
		}
		if !same {
			return nil, rule.ErrConflict
		}
		return &Settlement{Admission: a, DeltaMicro: deref(a.EndDeltaMicro), BalanceMicro: deref(a.EndBalanceMicro),
			Snapshot: t.snapshot(now), Replayed: true}, nil
	}

	late := a.State == StateExpired
	actual := int64(0)
	if usage != nil {
		// Usage no request could have produced is refused before anything
		// moves: it would charge without bound.
		// The bounds count raw tokens: cache weights come after.
		rawIn, rawOut := usage.Tokens(a.Estimate)
		if err := SettleBounds(a.Estimate, d.table).Check(rawIn, rawOut); err != nil {
			return nil, err
		}
		actual = estimator.Cost(in, out, a.Estimate.InputWeightMicro, a.Estimate.OutputWeightMicro)
	}
	// The money of what it used, at the price it was reserved at (0 for a
	// release; nil when the model had no price then).
	var moneyActual *int64
	var tierDetailOf string // the tiers it was served and charged at, for its entries
	if a.MoneyEstimate != nil {
		m, charged, err := d.moneyActual(a, usage)
		if err != nil {
			return nil, err
		}
		moneyActual = &m
		served := estimator.TierOr(a.PriceTier)
		if usage != nil && usage.ServiceTier != "" && usage.RefundTokens == 0 {
			served = usage.ServiceTier
		}
		tierDetailOf = tierDetail(served, charged)
	}
	cost := a.Estimate.Cost
	kind := ledger.KindSettle
	if target == StateReleased {
		kind = ledger.KindRelease
	}
	// Every level the admission debited is corrected, each in its own chain.
	var applied int64
	for _, lv := range d.chain {
		skip := rule.SkipOf(a.Shadowed, lv.id)
		var debited *int64 // what its reserve took from this level, when not its estimate
		if lv == t {
			debited = a.DebitedMicro
		}
		delta, err := lv.EndDebited(rule.Amount{Cost: cost, Money: deref(a.MoneyEstimate)}, rule.Amount{Cost: actual, Money: deref(moneyActual)}, debited, a.CreatedAt, late, skip)
		if err != nil {
			return nil, err // not a decision: the batch is aborted, nothing moves
		}
		if lv == t {
			applied = delta
		}
		e := lv.entry(kind, now, actorOr(actor, "api"))
		e.AdmissionID, e.Model, e.Late = a.ID, a.Estimate.Model, late
		e.Estimate = &cost
		e.Actual = &actual
		e.DeltaMicro = delta
		if moneyActual != nil {
			moved := *moneyActual - *a.MoneyEstimate
			e.MoneyMicro = &moved
		}
		var detail []string
		if tierDetailOf != "" {
			detail = append(detail, tierDetailOf)
		}
		if m := d.models[[2]string{lv.id, a.Family}]; m != nil && slices.Contains(a.ModelLevels, lv.id) {
			m.end(a.Estimate.InputTokens, a.Estimate.OutputTokens, in, out, skip)
			d.w.model(m)
			detail = append(detail, m.detail())
		}
		if pl := d.pools[a.PoolID]; pl != nil && lv == t {
			pl.Correct(t.id, a.Estimate.InputTokens+a.Estimate.OutputTokens, in+out, now)
			detail = append(detail, poolDetail(pl))
		}
		e.Detail = joinDetail(detail)
		e.Reason = joinReason(shadowReason(skip), d.note)
		lv.seal(e)
		d.w.entry(lv, e)
	}

	ended := *a
	ended.State, ended.Late = target, late
	ended.EndedAt = &now
	if usage != nil {
		ended.ActualInput, ended.ActualOutput = &in, &out
	}
	ended.ActualCost = &actual
	ended.MoneyActual = moneyActual
	balance := t.Tokens.BalanceMicro
	ended.EndDeltaMicro, ended.EndBalanceMicro = &applied, &balance
	d.adms[admissionID] = &ended
	d.w.end(&ended)
	return &Settlement{Admission: &ended, DeltaMicro: applied, BalanceMicro: balance, Snapshot: t.snapshot(now)}, nil
}
