package replica

import (
	"context"
	"errors"
	"sync"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

// maxOpen bounds the leased admissions a replica remembers to settle in
// its journal: past it the oldest are forgotten, and settled exactly (as
// every admission can be), so an admission never settled costs memory for
// a while, not for ever.
const maxOpen = 1 << 16

// opened is a leased admission this replica made, as its settle in the
// journal needs it, and no more (the index holds up to maxOpen of them,
// and the collector scans each): its lease, its byKey entry ("" for none),
// tenant, face, whether it has a price, and its estimate.
type opened struct {
	id, lease, key, tenant string
	face                   rule.Face
	priced                 bool
	est                    estimator.Estimate
}

// openIndex is the leased admissions a replica made and has not seen
// settled, by id and by (tenant, stored Idempotency-Key), oldest first.
type openIndex struct {
	mu    sync.Mutex
	byID  map[string]opened
	byKey map[string]string // tenant \x00 stored key -> admission id
	order []string          // ids, oldest first (some already taken)
}

func openKey(tenant, stored string) string { return tenant + "\x00" + stored }

func (x *openIndex) add(leaseID string, a *account.Admission, stored string) {
	o := opened{id: a.ID, lease: leaseID, tenant: a.TenantID, face: a.Face.Or(), priced: a.MoneyEstimate != nil, est: a.Estimate}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.byID == nil {
		x.byID, x.byKey = map[string]opened{}, map[string]string{}
	}
	if stored != "" {
		o.key = openKey(a.TenantID, stored)
		x.byKey[o.key] = a.ID
	}
	x.byID[a.ID] = o
	x.order = append(x.order, a.ID)
	for len(x.byID) > maxOpen || len(x.order) > 2*maxOpen {
		id := x.order[0]
		x.order = x.order[1:]
		if o, ok := x.byID[id]; ok {
			x.drop(o)
		}
	}
}

// drop forgets o.
func (x *openIndex) drop(o opened) {
	delete(x.byID, o.id)
	if o.key != "" && x.byKey[o.key] == o.id {
		delete(x.byKey, o.key)
	}
}

// take removes and returns the admission a settle names (by id, or by its
// tenant's stored key), if this replica made it from a lease.
func (x *openIndex) take(tenant, id, stored string) (opened, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if id == "" && stored != "" {
		id = x.byKey[openKey(tenant, stored)]
	}
	o, ok := x.byID[id]
	if !ok || o.tenant != tenant {
		return opened{}, false
	}
	x.drop(o)
	return o, true
}

// Settle settles p in the journal when it ends an admission this replica
// made from a lease it still holds (docs/leasing.md, item 5): its usage,
// bounds and cost computed as an exact settle computes them with table,
// its refund back into the lease (and the holder's unused part), its
// settle entries written by the lease's booking. ok false: p is for the
// exact pipeline (not such an admission, another face's, a release, a
// price to settle, usage past the estimate or out of bounds, the lease
// ended, the admission not open there, a credential's refusal), which
// decides it as before, refusals included. An error with ok true is the
// caller's context ending while the end journaled: its outcome is unknown.
func (l *Leases) Settle(ctx context.Context, p account.SettleParams, table *estimator.Table) (*account.Settlement, bool, error) {
	if table == nil || p.RefundTokens != 0 {
		return nil, false, nil
	}
	stored := ""
	if p.AdmissionID == "" {
		stored = p.Face.StoredKey(p.IdempotencyKey)
	}
	o, ok := l.open.take(p.TenantID, p.AdmissionID, stored)
	if !ok {
		return nil, false, nil
	}
	rawIn, rawOut := p.Tokens(o.est)
	if o.face != p.Face.Or() || o.priced || account.SettleBounds(o.est, table).Check(rawIn, rawOut) != nil {
		return nil, false, nil
	}
	in, out := p.Usage(o.est, table)
	actual := estimator.Cost(in, out, o.est.InputWeightMicro, o.est.OutputWeightMicro)
	refund := (o.est.Cost - actual) * rule.Micro
	if refund < 0 {
		return nil, false, nil
	}
	hd := l.holder(o.tenant)
	err := hd.h.EndHeld(ctx, o.lease, lease.End{AdmissionID: o.id, TenantID: o.tenant, GatewayID: p.GatewayID,
		InputTokens: in, OutputTokens: out, ActualCost: actual, RefundMicro: refund})
	switch {
	case ctx.Err() != nil && err != nil:
		return nil, true, err
	case errors.Is(err, lease.ErrNotOpen), errors.Is(err, lease.ErrOver), err != nil:
		return nil, false, nil
	}
	now := l.cfg.NowFunc()
	ended := account.Admission{ID: o.id, TenantID: o.tenant, Estimate: o.est, Face: o.face, Family: account.ModelKey(o.est)}
	ended.State, ended.EndedAt = account.StateSettled, &now
	ended.ActualInput, ended.ActualOutput, ended.ActualCost = &in, &out, &actual
	// The refund is the tenant's again (in its lease on this replica, and
	// in its balance with the lease's return): the answer says so, as an
	// exact settle's does; the balance is what a lease admission answers.
	ended.EndDeltaMicro = &refund
	snap := rule.Snapshot{TenantID: o.tenant}
	if s := hd.snap.Load(); s != nil {
		snap = *s
		snap.TokensMicro += hd.h.State().UnusedMicro
	}
	ended.EndBalanceMicro = &snap.TokensMicro
	return &account.Settlement{Admission: &ended, DeltaMicro: refund, BalanceMicro: snap.TokensMicro, Snapshot: snap}, true, nil
}
