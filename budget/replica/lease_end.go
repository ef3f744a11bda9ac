package replica

import (
	"context"
	"errors"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

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
