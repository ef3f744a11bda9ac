package admin

import (
	"context"

	"github.com/tokengate/tokengate/budget/lease"
)

// TenantLeaseModeSet sets a tenant's lease mode (off or auto), with its
// ledger entry, in one transaction; the answer names the rule that keeps
// the tenant exact whatever its mode, if one does. It returns a
// *rule.LimitError (field lease) or rule.ErrTenantNotFound.
func (s *Service) TenantLeaseModeSet(ctx context.Context, p lease.SetModeParams) (lease.ModeState, error) {
	return s.leases.SetMode(ctx, p)
}

// TenantLeaseMode returns a tenant's lease mode, or rule.ErrTenantNotFound.
func (s *Service) TenantLeaseMode(ctx context.Context, tenantID string) (lease.Mode, error) {
	return s.leases.ModeOf(ctx, tenantID)
}
