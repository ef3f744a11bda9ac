package account

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/rule"
)

var (
	//go:embed sql/pool_lock.sql
	poolLockSQL string
	//go:embed sql/pool_routes.sql
	poolRoutesSQL string
	//go:embed sql/pool_lock_ids.sql
	poolLockIDsSQL string
	//go:embed sql/pool_shares_ids.sql
	poolSharesIDsSQL string
	//go:embed sql/pool_shares_get.sql
	poolSharesGetSQL string
	//go:embed sql/pool_update.sql
	poolUpdateSQL string
	//go:embed sql/pool_shares_put.sql
	poolSharesPutSQL string
)

type poolRow struct {
	ID              string    `db:"id"`
	TokensCapacity  int64     `db:"tokens_capacity"`
	TokensRateMicro int64     `db:"tokens_rate_micro"`
	TokensMicro     int64     `db:"tokens_micro"`
	TokensAt        time.Time `db:"tokens_at"`
	CreatedAt       time.Time `db:"created_at"`
}

func (r *poolRow) pool() *rule.Pool {
	return &rule.Pool{ID: r.ID, Shares: map[string]*rule.Share{},
		Tokens: rule.Bucket{CapacityMicro: r.TokensCapacity * rule.Micro, RateMicro: r.TokensRateMicro, BalanceMicro: r.TokensMicro, At: r.TokensAt}}
}

type shareRow struct {
	PoolID   string     `db:"pool_id"`
	TenantID string     `db:"tenant_id"`
	Weight   int64      `db:"weight"`
	VTCMicro int64      `db:"vtc_micro"`
	Served   int64      `db:"served"`
	ActiveAt *time.Time `db:"active_at"`
}

// scanPools reads locked pools, then their shares.
func scanPools(br pgx.BatchResults) (map[string]*rule.Pool, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("budget: pools: %w", err)
	}
	prs, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[poolRow])
	if err != nil {
		return nil, fmt.Errorf("budget: pools: %w", err)
	}
	pools := make(map[string]*rule.Pool, len(prs))
	for _, r := range prs {
		pools[r.ID] = r.pool()
	}
	rows, err = br.Query()
	if err != nil {
		return nil, fmt.Errorf("budget: pool shares: %w", err)
	}
	srs, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[shareRow])
	if err != nil {
		return nil, fmt.Errorf("budget: pool shares: %w", err)
	}
	for _, r := range srs {
		if p := pools[r.PoolID]; p != nil {
			p.Shares[r.TenantID] = &rule.Share{TenantID: r.TenantID, Weight: r.Weight, VTCMicro: r.VTCMicro, Served: r.Served, ActiveAt: r.ActiveAt}
		}
	}
	return pools, nil
}

// poolRoutesTTL is how long a replica decides with its copy of the pool
// routes (which models draw on which pool) before reading them again. A
// route changed through this replica applies at once; one changed
// elsewhere, within this time, as model-table edits do. Keeping the routes
// out of the decision's statements is what makes pools free for the
// deployments that have none.
const poolRoutesTTL = 2 * time.Second

type routeCache struct {
	routes map[string]string // model key -> pool
	at     time.Time
}

// poolRoutes returns the pool routes, read again when older than
// poolRoutesTTL.
func (s *Store) poolRoutes(ctx context.Context) (map[string]string, error) {
	if c := s.routes.Load(); c != nil && time.Since(c.at) < poolRoutesTTL {
		return c.routes, nil
	}
	countTrip(ctx)
	rows, err := s.pool.Query(ctx, poolRoutesSQL)
	if err != nil {
		return nil, classify(fmt.Errorf("budget: pool routes: %w", err), false, false)
	}
	routes := map[string]string{}
	var model, poolID string
	if _, err := pgx.ForEachRow(rows, []any{&model, &poolID}, func() error {
		routes[model] = poolID
		return nil
	}); err != nil {
		return nil, classify(fmt.Errorf("budget: pool routes: %w", err), false, false)
	}
	s.routes.Store(&routeCache{routes: routes, at: time.Now()})
	return routes, nil
}

// periodAlertRules refreshes, when older than poolRoutesTTL, the store's
// cache of whether any period_budget alert rule exists (alert.PeriodRules).
// A rule created through this replica applies at once; elsewhere, within
// the TTL.
func (s *Store) periodAlertRules(ctx context.Context) error {
	if err := s.periodAlerts.Refresh(ctx, s.pool, poolRoutesTTL); err != nil {
		return classify(fmt.Errorf("budget: alert rules: %w", err), false, false)
	}
	return nil
}

// NotePeriodAlertRule tells the store that a period_budget rule now
// exists, so that its next decision raises thresholds without waiting for
// the cache.
func (s *Store) NotePeriodAlertRule() { s.periodAlerts.Note() }

// lockPoolsLate locks, in a decision's transaction, pools that its ended
// admissions drew on but that its first round trip did not lock (routes
// this replica had not read yet). Rare: it costs a round trip, and it may
// lock out of id order, which Postgres's deadlock detection and the
// decision's retry resolve.
func (tx *lockedTx) lockPoolsLate(ctx context.Context, ids []string, into map[string]*rule.Pool) error {
	b := &pgx.Batch{}
	b.Queue(poolLockIDsSQL, ids)
	b.Queue(poolSharesIDsSQL, ids)
	countTrip(ctx)
	br := tx.conn.SendBatch(ctx, b)
	more, err := scanPools(br)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return tx.store.classify(ctx, fmt.Errorf("budget: lock pools: %w", err), false, false, tx.since)
	}
	for id, p := range more {
		into[id] = p
	}
	return nil
}

// poolDetail is how the entry of an admission that drew on pool p records it.
func poolDetail(p *rule.Pool) string {
	return `"pool":` + strconv.Quote(p.ID) + `,"pool_micro":` + strconv.FormatInt(p.Tokens.BalanceMicro, 10)
}

// writePools queues the pools and shares a batch changed.
func writePools(b *pgx.Batch, pools map[string]*rule.Pool) (queued []int64) {
	var ids []string
	var bal []int64
	var at []time.Time
	var sp, st []string
	var sw, sv, ss []int64
	var sa []*time.Time
	for _, p := range pools {
		if !p.Changed {
			continue
		}
		ids, bal, at = append(ids, p.ID), append(bal, p.Tokens.BalanceMicro), append(at, p.Tokens.At)
		for _, sh := range p.Shares {
			if sh.Changed {
				sp, st, sw, sv, ss, sa = append(sp, p.ID), append(st, sh.TenantID), append(sw, sh.Weight), append(sv, sh.VTCMicro), append(ss, sh.Served), append(sa, sh.ActiveAt)
			}
		}
	}
	if len(ids) > 0 {
		b.Queue(poolUpdateSQL, ids, bal, at)
		queued = append(queued, int64(len(ids)))
	}
	if len(sp) > 0 {
		b.Queue(poolSharesPutSQL, sp, st, sw, sv, ss, sa)
		queued = append(queued, int64(len(sp)))
	}
	return queued
}
