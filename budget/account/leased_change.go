package account

import (
	"context"
	"fmt"
	"time"

	"github.com/tokengate/tokengate/budget/rule"
)

// lockTree is lockTenant that keeps the locked rows (the tenant's and its
// ancestors'), so that an admin change can hand its tree to a LevelsFunc.
// It returns ErrTenantNotFound.
func (s *Store) lockTree(ctx context.Context, tenantID string) (*lockedTx, map[string]*tenant, *tenant, time.Time, error) {
	tx, ts, now, err := s.lockTenants(ctx, []string{tenantID}, nil, nil)
	if err != nil {
		return nil, nil, nil, time.Time{}, err
	}
	t, ok := ts[tenantID]
	if !ok {
		tx.abort()
		return nil, nil, nil, time.Time{}, rule.ErrTenantNotFound
	}
	return tx, ts, t, now, nil
}

// levelsIn runs fn, an admin change's LevelsFunc, in that change's
// transaction (tx, the rows of t's tree locked, the change already
// decided) and queues its moves on w as LockedLevels applies them: each
// level's balance moved (a refund capped at capacity, a debit never below
// zero) with its chained entry. budget/admin ends a tenant's leases so, in
// the transaction that disables it or changes its limits or scope, so that
// the journal refuses the next admission of its leases at once.
func levelsIn(ctx context.Context, tx *lockedTx, ts map[string]*tenant, t *tenant, now time.Time, fn LevelsFunc, w *writes) error {
	if fn == nil {
		return nil
	}
	chain, err := chainOf(ts, t)
	if err != nil {
		return err
	}
	levels := make([]Level, len(chain))
	byID := make(map[string]*tenant, len(chain))
	for i, lv := range chain {
		lv.advance(now)
		byID[lv.id] = lv
		levels[i] = Level{TenantID: lv.id, BalanceMicro: lv.Tokens.BalanceMicro, CapacityMicro: lv.Tokens.CapacityMicro, RateMicro: lv.Tokens.RateMicro, ExactOnly: lv.exactOnly()}
	}
	moves, err := fn(ctx, tx.conn, now, levels)
	if err != nil {
		return err
	}
	for _, m := range moves {
		lv := byID[m.TenantID]
		if lv == nil {
			return fmt.Errorf("budget: tenant %s is not a level of %s", m.TenantID, t.id)
		}
		d := m.DeltaMicro
		switch {
		case d < 0 && lv.Tokens.BalanceMicro+d < 0:
			return fmt.Errorf("budget: tenant %s: %w", m.TenantID, ErrLevelShort)
		case d < 0:
			lv.Tokens.BalanceMicro += d
		case d > 0:
			d = lv.Tokens.Refund(d)
		}
		e := lv.entry(m.Kind, now, actorOr(m.Actor, "lease"))
		e.DeltaMicro, e.AdmissionID, e.Model, e.Estimate, e.MoneyMicro = d, m.Ref, m.Model, m.Estimate, m.MoneyMicro
		e.Reason, e.Detail = m.Reason, m.Detail
		lv.seal(e)
		w.entry(lv, e)
	}
	return nil
}
