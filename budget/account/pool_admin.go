package account

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tokengate/tokengate/budget/rule"
)

var (
	//go:embed sql/pool_insert.sql
	poolInsertSQL string
	//go:embed sql/pool_set_limits.sql
	poolSetLimitsSQL string
	//go:embed sql/pool_route.sql
	poolRouteSQL string
	//go:embed sql/pool_unroute.sql
	poolUnrouteSQL string
	//go:embed sql/pool_weight.sql
	poolWeightSQL string
	//go:embed sql/pool_list.sql
	poolListSQL string
)

// CreatePool creates a pool with a full bucket. It returns a *LimitError
// or rule.ErrPoolExists.
func (s *Store) CreatePool(ctx context.Context, id string, l rule.PoolLimits) error {
	if err := rule.ValidateTenantID(id); err != nil {
		return err
	}
	if err := l.Validate(); err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, poolInsertSQL, id, l.TokensCapacity, l.TokensRateMicro, s.clock())
	if err != nil {
		return fmt.Errorf("budget: create pool %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return rule.ErrPoolExists
	}
	return nil
}

// SetPoolLimits changes a pool's bucket under its row lock: refilled to
// now at the old rate first, then cut to a lowered capacity. It returns a
// *LimitError or rule.ErrPoolNotFound.
func (s *Store) SetPoolLimits(ctx context.Context, id string, l rule.PoolLimits) error {
	if err := l.Validate(); err != nil {
		return err
	}
	return s.withPoolLock(ctx, id, func(tx pgx.Tx, p *rule.Pool, now time.Time) error {
		p.Tokens.Refill(now)
		p.Tokens.CapacityMicro, p.Tokens.RateMicro = l.TokensCapacity*rule.Micro, l.TokensRateMicro
		p.Tokens.BalanceMicro = min(p.Tokens.BalanceMicro, p.Tokens.CapacityMicro)
		_, err := tx.Exec(ctx, poolSetLimitsSQL, id, l.TokensCapacity, l.TokensRateMicro, p.Tokens.BalanceMicro, p.Tokens.At)
		return err
	})
}

// RoutePool makes admissions of model draw on pool ("" takes the model off
// any pool). It returns rule.ErrPoolNotFound.
func (s *Store) RoutePool(ctx context.Context, model, poolID string) error {
	if model == "" || len(model) > 200 {
		return &rule.LimitError{Field: "model", Reason: "must be 1 to 200 characters"}
	}
	if poolID == "" {
		_, err := s.pool.Exec(ctx, poolUnrouteSQL, model)
		s.routes.Store(nil)
		return err
	}
	defer s.routes.Store(nil) // this replica applies the change at once
	return s.withPoolLock(ctx, poolID, func(tx pgx.Tx, _ *rule.Pool, _ time.Time) error {
		_, err := tx.Exec(ctx, poolRouteSQL, model, poolID)
		return err
	})
}

// SetPoolWeight sets a tenant's weight in a pool, under the pool's lock
// like every write of its shares (the counter is kept). It returns a
// *LimitError, rule.ErrPoolNotFound or ErrTenantNotFound.
func (s *Store) SetPoolWeight(ctx context.Context, poolID, tenantID string, weight int64) error {
	if err := rule.ValidatePoolWeight(weight); err != nil {
		return err
	}
	return s.withPoolLock(ctx, poolID, func(tx pgx.Tx, _ *rule.Pool, _ time.Time) error {
		_, err := tx.Exec(ctx, poolWeightSQL, poolID, tenantID, weight)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23503" {
			return rule.ErrTenantNotFound
		}
		return err
	})
}

// withPoolLock runs fn in a transaction holding the pool's row lock.
func (s *Store) withPoolLock(ctx context.Context, id string, fn func(pgx.Tx, *rule.Pool, time.Time) error) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, poolLockIDsSQL, []string{id})
		if err != nil {
			return err
		}
		r, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[poolRow])
		if errors.Is(err, pgx.ErrNoRows) {
			return rule.ErrPoolNotFound
		}
		if err != nil {
			return err
		}
		var now time.Time
		if err := tx.QueryRow(ctx, clockSQL, s.clock()).Scan(&now); err != nil {
			return err
		}
		return fn(tx, r.pool(), now)
	})
	if err != nil && !errors.Is(err, rule.ErrPoolNotFound) && !errors.Is(err, rule.ErrTenantNotFound) {
		return fmt.Errorf("budget: pool %s: %w", id, err)
	}
	return err
}

// Pools lists every pool with its models and shares, refilled to the
// database's clock now, without locking.
func (s *Store) Pools(ctx context.Context) ([]rule.PoolSnapshot, error) {
	rows, err := s.pool.Query(ctx, poolListSQL, s.clock())
	if err != nil {
		return nil, fmt.Errorf("budget: pools: %w", err)
	}
	type row struct {
		poolRow
		Now    time.Time `db:"now"`
		Models []string  `db:"models"`
		Shares []string  `db:"shares"`
	}
	rs, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[row])
	if err != nil {
		return nil, fmt.Errorf("budget: pools: %w", err)
	}
	out := make([]rule.PoolSnapshot, len(rs))
	for i, r := range rs {
		p := r.pool()
		p.Tokens.Refill(r.Now)
		ps := rule.PoolSnapshot{ID: r.ID, Limits: rule.PoolLimits{TokensCapacity: r.TokensCapacity, TokensRateMicro: r.TokensRateMicro}, TokensMicro: p.Tokens.BalanceMicro,
			Models: r.Models, At: r.Now}
		for _, sh := range r.Shares { // tenant:weight:vtc:served
			var x rule.PoolShare
			if _, err := fmt.Sscanf(sh, "%s %d %d %d", &x.TenantID, &x.Weight, &x.VTCMicro, &x.Served); err == nil {
				ps.Shares = append(ps.Shares, x)
			}
		}
		out[i] = ps
	}
	return out, nil
}
