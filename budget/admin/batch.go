package admin

import (
	"context"

	"github.com/tokengate/tokengate/budget/batch"
)

// BatchAllowanceSet sets a tenant's enqueued-tokens allowance for batches
// (capacity in tokens at batch prices, and the models a batch line may
// name; none: any), with a limits entry. It returns a *rule.LimitError or
// rule.ErrTenantNotFound.
func (s *Service) BatchAllowanceSet(ctx context.Context, p batch.SetAllowanceParams) (batch.Allowance, error) {
	return s.batches.SetAllowance(ctx, p)
}

// BatchAllowance reads a tenant's batch allowance. It returns
// batch.ErrNoAllowance.
func (s *Service) BatchAllowance(ctx context.Context, tenantID string) (batch.Allowance, error) {
	return s.batches.Allowance(ctx, tenantID)
}
