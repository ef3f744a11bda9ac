package admin

import (
	"context"

	"github.com/tokengate/tokengate/budget/rule"
)

// PoolList returns every shared pool with its shares.
func (s *Service) PoolList(ctx context.Context) ([]rule.PoolSnapshot, error) {
	return s.store.Pools(ctx)
}

// Pool returns one pool, or rule.ErrPoolNotFound.
func (s *Service) Pool(ctx context.Context, id string) (rule.PoolSnapshot, error) {
	pools, err := s.store.Pools(ctx)
	if err != nil {
		return rule.PoolSnapshot{}, err
	}
	for _, p := range pools {
		if p.ID == id {
			return p, nil
		}
	}
	return rule.PoolSnapshot{}, rule.ErrPoolNotFound
}

// PoolCreate creates a pool and routes models to it. It returns
// rule.ErrPoolExists or a validation error.
func (s *Service) PoolCreate(ctx context.Context, id string, l rule.PoolLimits, models ...string) error {
	if err := s.store.CreatePool(ctx, id, l); err != nil {
		return err
	}
	for _, m := range models {
		if err := s.store.RoutePool(ctx, m, id); err != nil {
			return err
		}
	}
	return nil
}

// PoolSetLimits changes a pool's limits. It returns rule.ErrPoolNotFound.
func (s *Service) PoolSetLimits(ctx context.Context, id string, l rule.PoolLimits) error {
	return s.store.SetPoolLimits(ctx, id, l)
}

// PoolRoute sends a model's admissions through a pool ("" unroutes it).
func (s *Service) PoolRoute(ctx context.Context, model, poolID string) error {
	return s.store.RoutePool(ctx, model, poolID)
}

// PoolSetWeight sets a tenant's weight in a pool.
func (s *Service) PoolSetWeight(ctx context.Context, poolID, tenantID string, weight int64) error {
	return s.store.SetPoolWeight(ctx, poolID, tenantID, weight)
}
