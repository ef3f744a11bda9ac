package admin

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/budget/lease"
	"github.com/tokengate/tokengate/budget/rule"
)

// An admin change that takes a tenant out of leasing, or changes what its
// leases may admit, applies to the next admission at once, as it does in
// exact mode: a disable, new limits or a new model scope ends the live
// leases of the tenant and its descendants in the change's own
// transaction, under the same tree locks (lease.Store.EndLocked: the
// tenant's own are booked and refunded there; its descendants' are cut,
// then ended right after the commit); a key revoked or rescoped locks the
// tenant's live leases, so that no journal group of them is in flight as
// it commits and every later group reads the key as changed.

// endAfter ends the leases a change cut (its descendants'), after its
// commit. A failure is logged, not returned: the change is made, the cut
// leases already refuse every admission, and the sweepers end them.
func (s *Service) endAfter(ctx context.Context, tenantID string, ended lease.Ended) {
	if err := s.leases.EndCut(ctx, ended); err != nil {
		s.logger.Warn("admin: end the leases below a changed tenant; the sweepers will", "tenant", tenantID, "err", err)
	}
}

// endingLeases runs change, an admin change of tenantID that takes fn as
// its LevelsFunc (ending the tree's live leases in its transaction), and
// then ends the leases it cut below the tenant: the one way every change
// that ends leases is made.
func (s *Service) endingLeases(ctx context.Context, tenantID string, change func(fn account.LevelsFunc) (rule.Snapshot, error)) (rule.Snapshot, error) {
	var ended lease.Ended
	snap, err := change(s.leases.EndFunc(&ended))
	if err == nil {
		s.endAfter(ctx, tenantID, ended)
	}
	return snap, err
}

func (s *Service) limitsUpdate(ctx context.Context, p account.UpdateLimitsParams) (rule.Snapshot, error) {
	return s.endingLeases(ctx, p.TenantID, func(fn account.LevelsFunc) (rule.Snapshot, error) {
		p.LevelsFunc = fn
		return s.store.UpdateLimits(ctx, p)
	})
}

func (s *Service) setDisabled(ctx context.Context, p account.SetDisabledParams) (rule.Snapshot, error) {
	return s.endingLeases(ctx, p.TenantID, func(fn account.LevelsFunc) (rule.Snapshot, error) {
		p.LevelsFunc = fn
		return s.store.SetDisabled(ctx, p)
	})
}

func (s *Service) setModels(ctx context.Context, p account.SetModelsParams) (rule.Snapshot, error) {
	return s.endingLeases(ctx, p.TenantID, func(fn account.LevelsFunc) (rule.Snapshot, error) {
		p.LevelsFunc = fn
		return s.store.SetModels(ctx, p)
	})
}

// leaseLocking records key events as the store does, with the tenant's
// live leases locked after the key's write in the same transaction
// (lease.Store.LockLive): the journal reads keys after it locks its
// leases, so it refuses a revoked key's admission from the revoke's
// commit on.
type leaseLocking struct {
	store  *account.Store
	leases *lease.Store
}

func (r leaseLocking) RecordKeyEvent(ctx context.Context, p account.KeyEventParams) error {
	write := p.WriteFunc
	p.WriteFunc = func(ctx context.Context, conn *pgxpool.Conn) error {
		if write != nil {
			if err := write(ctx, conn); err != nil {
				return err
			}
		}
		return r.leases.LockLive(ctx, conn, p.TenantID)
	}
	return r.store.RecordKeyEvent(ctx, p)
}
