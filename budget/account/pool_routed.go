package account

import (
	"context"

	"github.com/tokengate/tokengate/estimator"
)

// PoolRouted reports whether a request of e's model draws on an upstream
// pool, from the replica's copy of the routes (poolRoutes): quota leasing
// (budget/admission) decides such a request exactly, since a pool's fair
// share depends on every tenant's live state.
func (s *Store) PoolRouted(ctx context.Context, e estimator.Estimate) (bool, error) {
	routes, err := s.poolRoutes(ctx)
	if err != nil {
		return false, err
	}
	_, ok := routes[ModelKey(e)]
	return ok, nil
}
