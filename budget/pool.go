package budget

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// LimitPool is an upstream capacity pool's limit, as a rejection names it.
const LimitPool Limit = "pool"

// Priority is a key's class among requests waiting for a pool.
type Priority string

// The priority classes, first served first.
const (
	PriorityCritical  Priority = "critical"
	PriorityStandard  Priority = "standard"
	PrioritySheddable Priority = "sheddable"
)

// Rank orders the classes: critical 0, standard 1, sheddable 2 (an unknown
// class is standard).
func (p Priority) Rank() int {
	switch p {
	case PriorityCritical:
		return 0
	case PrioritySheddable:
		return 2
	}
	return 1
}

// Valid reports whether p is a class.
func (p Priority) Valid() bool {
	return p == PriorityCritical || p == PriorityStandard || p == PrioritySheddable
}

// poolActiveWindow is how recently a tenant must have been served from a
// pool to count as backlogged there. A tenant that returns after a longer
// pause has its counter lifted to the lowest counter of those still
// active, as the virtual token counter prescribes: idle time earns no
// credit to crowd out the tenants that kept the pool busy.
const poolActiveWindow = 10 * time.Second

// PoolState is a pool as a decision left it: its balance, and each
// tenant's virtual token counter, for a replica to order the requests it
// holds waiting for the pool.
type PoolState struct {
	ID          string
	TokensMicro int64
	// VTC is each tenant's served raw tokens divided by its weight, in
	// micro units.
	VTC map[string]int64
}

// pool is one pool as a decision holds it under its row lock.
type pool struct {
	id      string
	Tokens  Bucket
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
		Tokens: Bucket{CapacityMicro: r.TokensCapacity * Micro, RateMicro: r.TokensRateMicro, BalanceMicro: r.TokensMicro, At: r.TokensAt}}
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

// lockPoolsLate locks, in a decision's transaction, pools that its ended
// admissions drew on but that its first round trip did not lock (routes
// this replica had not read yet). Rare: it costs a round trip, and it may
// lock out of id order, which Postgres's deadlock detection and the
// decision's retry resolve.
func (tx *lockedTx) lockPoolsLate(ctx context.Context, ids []string, into map[string]*pool) error {
	b := &pgx.Batch{}
	b.Queue(poolLockIDsSQL, ids)
	b.Queue(poolSharesIDsSQL, ids)
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
	if need > p.Tokens.CapacityMicro/Micro {
		return &TooLargeError{Limit: LimitPool, Pool: p.id, Cost: need, Capacity: p.Tokens.CapacityMicro / Micro}
	}
	want := need*Micro + max(0, holdbackMicro)
	if want > p.Tokens.BalanceMicro {
		return &RejectedError{Limit: LimitPool, Pool: p.id, RetryAfter: roundUpMS(p.Tokens.TimeUntil(want))}
	}
	return nil
}

// serve takes need from the pool for tenantID and counts it to its share.
func (p *pool) serve(tenantID string, need int64, now time.Time, backlogged bool) {
	sh := p.shareOf(tenantID, now, backlogged)
	p.Tokens.BalanceMicro -= need * Micro
	sh.vtc += need * Micro / sh.weight
	sh.served += need
	sh.activeAt = &now
	sh.changed, p.changed = true, true
}

// correct moves a served amount to what was used (refund capped at the
// pool's capacity), and the tenant's counter with it.
func (p *pool) correct(tenantID string, reserved, used int64, now time.Time) {
	sh := p.shareOf(tenantID, now, false)
	p.Tokens.Refund((reserved - used) * Micro)
	sh.vtc = max(0, sh.vtc+(used-reserved)*Micro/sh.weight)
	sh.served += used - reserved
	sh.changed, p.changed = true, true
}

func (p *pool) state() *PoolState {
	s := &PoolState{ID: p.id, TokensMicro: p.Tokens.BalanceMicro, VTC: make(map[string]int64, len(p.shares))}
	for id, sh := range p.shares {
		s.VTC[id] = sh.vtc
	}
	return s
}

// detail is how the entry of an admission that drew on the pool records it.
func (p *pool) detail() string {
	return `"pool":` + strconv.Quote(p.id) + `,"pool_micro":` + strconv.FormatInt(p.Tokens.BalanceMicro, 10)
}

// queuePools adds a batch's pool reads after its admission locks: the pools
// the reserves' models route to and those the ended admissions drew on,
// locked in id order, then their shares.
func queuePools(b *pgx.Batch, poolIDs, admIDs []string) {
	b.Queue(poolLockSQL, poolIDs, admIDs)
	b.Queue(poolSharesGetSQL, poolIDs, admIDs)
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

// ErrPoolNotFound: no pool has that id.
var ErrPoolNotFound = errors.New("budget: pool not found")

// ErrPoolExists: CreatePool found the id taken.
var ErrPoolExists = errors.New("budget: pool already exists")

// PoolLimits are a pool's token bucket, in raw tokens (input + output).
type PoolLimits struct {
	TokensCapacity  int64
	TokensRateMicro int64
}

// Validate returns a *LimitError naming the first invalid field.
func (l PoolLimits) Validate() error {
	switch {
	case l.TokensCapacity <= 0 || l.TokensCapacity > maxAmount:
		return &LimitError{"tokens_capacity", fmt.Sprintf("must be between 1 and %d", int64(maxAmount))}
	case l.TokensRateMicro <= 0 || l.TokensRateMicro > maxAmount*Micro/1000:
		return &LimitError{"tokens_per_second", "must be greater than 0 (and at most 1e9)"}
	}
	return nil
}

// PoolShare is one tenant's share of a pool.
type PoolShare struct {
	TenantID string
	Weight   int64
	// VTCMicro is the virtual token counter: served / weight, in micro units.
	VTCMicro int64
	Served   int64
}

// PoolSnapshot is a pool, its models and its shares at one instant.
type PoolSnapshot struct {
	ID          string
	Limits      PoolLimits
	TokensMicro int64
	Models      []string
	Shares      []PoolShare
	At          time.Time
}

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
// or ErrPoolExists.
func (s *Store) CreatePool(ctx context.Context, id string, l PoolLimits) error {
	if err := ValidateTenantID(id); err != nil {
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
		return ErrPoolExists
	}
	return nil
}

// SetPoolLimits changes a pool's bucket under its row lock: refilled to
// now at the old rate first, then cut to a lowered capacity. It returns a
// *LimitError or ErrPoolNotFound.
func (s *Store) SetPoolLimits(ctx context.Context, id string, l PoolLimits) error {
	if err := l.Validate(); err != nil {
		return err
	}
	return s.withPoolLock(ctx, id, func(tx pgx.Tx, p *pool, now time.Time) error {
		p.Tokens.Refill(now)
		p.Tokens.CapacityMicro, p.Tokens.RateMicro = l.TokensCapacity*Micro, l.TokensRateMicro
		p.Tokens.BalanceMicro = min(p.Tokens.BalanceMicro, p.Tokens.CapacityMicro)
		_, err := tx.Exec(ctx, poolSetLimitsSQL, id, l.TokensCapacity, l.TokensRateMicro, p.Tokens.BalanceMicro, p.Tokens.At)
		return err
	})
}

// RoutePool makes admissions of model draw on pool ("" takes the model off
// any pool). It returns ErrPoolNotFound.
func (s *Store) RoutePool(ctx context.Context, model, poolID string) error {
	if model == "" || len(model) > 200 {
		return &LimitError{"model", "must be 1 to 200 characters"}
	}
	if poolID == "" {
		_, err := s.pool.Exec(ctx, poolUnrouteSQL, model)
		s.routes.Store(nil)
		return err
	}
	defer s.routes.Store(nil) // this replica applies the change at once
	return s.withPoolLock(ctx, poolID, func(tx pgx.Tx, _ *pool, _ time.Time) error {
		_, err := tx.Exec(ctx, poolRouteSQL, model, poolID)
		return err
	})
}

// SetPoolWeight sets a tenant's weight in a pool, under the pool's lock
// like every write of its shares (the counter is kept). It returns a
// *LimitError, ErrPoolNotFound or ErrTenantNotFound.
func (s *Store) SetPoolWeight(ctx context.Context, poolID, tenantID string, weight int64) error {
	if weight < 1 || weight > 1_000_000 {
		return &LimitError{"weight", "must be between 1 and 1000000"}
	}
	return s.withPoolLock(ctx, poolID, func(tx pgx.Tx, _ *pool, _ time.Time) error {
		_, err := tx.Exec(ctx, poolWeightSQL, poolID, tenantID, weight)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23503" {
			return ErrTenantNotFound
		}
		return err
	})
}

// withPoolLock runs fn in a transaction holding the pool's row lock.
func (s *Store) withPoolLock(ctx context.Context, id string, fn func(pgx.Tx, *pool, time.Time) error) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT * FROM pools WHERE id = $1 FOR UPDATE`, id)
		if err != nil {
			return err
		}
		r, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[poolRow])
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrPoolNotFound
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
	if err != nil && !errors.Is(err, ErrPoolNotFound) && !errors.Is(err, ErrTenantNotFound) {
		return fmt.Errorf("budget: pool %s: %w", id, err)
	}
	return err
}

// Pools lists every pool with its models and shares, refilled to the
// database's clock now, without locking.
func (s *Store) Pools(ctx context.Context) ([]PoolSnapshot, error) {
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
	out := make([]PoolSnapshot, len(rs))
	for i, r := range rs {
		p := r.pool()
		p.Tokens.Refill(r.Now)
		ps := PoolSnapshot{ID: r.ID, Limits: PoolLimits{r.TokensCapacity, r.TokensRateMicro}, TokensMicro: p.Tokens.BalanceMicro,
			Models: r.Models, At: r.Now}
		for _, sh := range r.Shares { // tenant:weight:vtc:served
			var x PoolShare
			if _, err := fmt.Sscanf(sh, "%s %d %d %d", &x.TenantID, &x.Weight, &x.VTCMicro, &x.Served); err == nil {
				ps.Shares = append(ps.Shares, x)
			}
		}
		out[i] = ps
	}
	return out, nil
}
