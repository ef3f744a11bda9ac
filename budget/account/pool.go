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

// poolActiveWindow is how recently a tenant must have been served from a
// pool to count as backlogged there. A tenant that returns after a longer
// pause has its counter lifted to the lowest counter of those still
// active, as the virtual token counter prescribes: idle time earns no
// credit to crowd out the tenants that kept the pool busy.
const poolActiveWindow = 10 * time.Second

// pool is one pool as a decision holds it under its row lock.
type pool struct {
	id      string
	Tokens  rule.Bucket
	shares  map[string]*share
	changed bool
}

type share struct {
	tenantID string
	weight   int64
	vtc      int64 // micro
	served   int64
	activeAt *time.Time
	changed  bool
}

type poolRow struct {
	ID              string    `db:"id"`
	TokensCapacity  int64     `db:"tokens_capacity"`
	TokensRateMicro int64     `db:"tokens_rate_micro"`
	TokensMicro     int64     `db:"tokens_micro"`
	TokensAt        time.Time `db:"tokens_at"`
	CreatedAt       time.Time `db:"created_at"`
}

func (r *poolRow) pool() *pool {
	return &pool{id: r.ID, shares: map[string]*share{},
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
func scanPools(br pgx.BatchResults) (map[string]*pool, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("budget: pools: %w", err)
	}
	prs, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[poolRow])
	if err != nil {
		return nil, fmt.Errorf("budget: pools: %w", err)
	}
	pools := make(map[string]*pool, len(prs))
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
			p.shares[r.TenantID] = &share{tenantID: r.TenantID, weight: r.Weight, vtc: r.VTCMicro, served: r.Served, activeAt: r.ActiveAt}
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
func (tx *lockedTx) lockPoolsLate(ctx context.Context, ids []string, into map[string]*pool) error {
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

// shareOf is tenantID's share of the pool (weight 1 until an admin says
// otherwise), its counter lifted if the tenant was idle (poolActiveWindow)
// to the lowest counter of the tenants served meanwhile. A request that
// was already waiting for the pool (backlogged) was there before those
// tenants were served, which the counter's lift in the paper (on arrival,
// not on service) would credit: it is lifted to one pool's capacity below
// that floor instead, so a tenant that queued at the start is not robbed of
// its share, and one that returns after a long idle gains at most a bucket.
func (p *pool) shareOf(tenantID string, now time.Time, backlogged bool) *share {
	sh, ok := p.shares[tenantID]
	if !ok {
		sh = &share{tenantID: tenantID, weight: 1}
		p.shares[tenantID] = sh
	}
	if sh.activeAt == nil || now.Sub(*sh.activeAt) > poolActiveWindow {
		floor := int64(-1)
		for _, o := range p.shares {
			if o != sh && o.activeAt != nil && now.Sub(*o.activeAt) <= poolActiveWindow && (floor < 0 || o.vtc < floor) {
				floor = o.vtc
			}
		}
		if backlogged && floor > 0 {
			floor = max(0, floor-p.Tokens.CapacityMicro/sh.weight)
		}
		sh.vtc = max(sh.vtc, floor)
	}
	return sh
}

// refusal is whether need raw tokens fit the pool while leaving holdback
// for the requests queued ahead of this one.
func (p *pool) refusal(need, holdbackMicro int64) error {
	if need > p.Tokens.CapacityMicro/rule.Micro {
		return &rule.TooLargeError{Limit: rule.LimitPool, Pool: p.id, Cost: need, Capacity: p.Tokens.CapacityMicro / rule.Micro}
	}
	want := need*rule.Micro + max(0, holdbackMicro)
	if want > p.Tokens.BalanceMicro {
		return &rule.RejectedError{Limit: rule.LimitPool, Pool: p.id, RetryAfter: rule.RoundUpMS(p.Tokens.TimeUntil(want))}
	}
	return nil
}

// serve takes need from the pool for tenantID and counts it to its share.
func (p *pool) serve(tenantID string, need int64, now time.Time, backlogged bool) {
	sh := p.shareOf(tenantID, now, backlogged)
	p.Tokens.BalanceMicro -= need * rule.Micro
	sh.vtc += need * rule.Micro / sh.weight
	sh.served += need
	sh.activeAt = &now
	sh.changed, p.changed = true, true
}

// correct moves a served amount to what was used (refund capped at the
// pool's capacity), and the tenant's counter with it.
func (p *pool) correct(tenantID string, reserved, used int64, now time.Time) {
	sh := p.shareOf(tenantID, now, false)
	p.Tokens.Refund((reserved - used) * rule.Micro)
	sh.vtc = max(0, sh.vtc+(used-reserved)*rule.Micro/sh.weight)
	sh.served += used - reserved
	sh.changed, p.changed = true, true
}

func (p *pool) state() *rule.PoolState {
	s := &rule.PoolState{ID: p.id, TokensMicro: p.Tokens.BalanceMicro, VTC: make(map[string]int64, len(p.shares))}
	for id, sh := range p.shares {
		s.VTC[id] = sh.vtc
	}
	return s
}

// detail is how the entry of an admission that drew on the pool records it.
func (p *pool) detail() string {
	return `"pool":` + strconv.Quote(p.id) + `,"pool_micro":` + strconv.FormatInt(p.Tokens.BalanceMicro, 10)
}

// writePools queues the pools and shares a batch changed.
func writePools(b *pgx.Batch, pools map[string]*pool) (queued []int64) {
	var ids []string
	var bal []int64
	var at []time.Time
	var sp, st []string
	var sw, sv, ss []int64
	var sa []*time.Time
	for _, p := range pools {
		if !p.changed {
			continue
		}
		ids, bal, at = append(ids, p.id), append(bal, p.Tokens.BalanceMicro), append(at, p.Tokens.At)
		for _, sh := range p.shares {
			if sh.changed {
				sp, st, sw, sv, ss, sa = append(sp, p.id), append(st, sh.tenantID), append(sw, sh.weight), append(sv, sh.vtc), append(ss, sh.served), append(sa, sh.activeAt)
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
