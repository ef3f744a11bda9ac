package account

// The load step of a decision (see decideOnce): everything a batch needs
// is read in the round trip that locks its tenants, so that the locks are
// held for two round trips whatever the batch holds.

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
)

//go:embed sql/gateway_live.sql
var gatewayLiveSQL string

// read is one read of the load step: queue adds its statements to the lock
// round trip, scan reads their results. A batch's reads are one slice that
// is iterated to queue them and again to scan them, so a read is never
// queued without its scan nor scanned out of order; and the slice's order
// is the lock order (tenants first, by lockTenants; then admissions, then
// pools).
type read interface {
	queue(b *pgx.Batch)
	scan(br pgx.BatchResults) error
}

// loaded is a batch's state as read under its locks, brought to now: what
// the decide step applies the batch's requests to.
type loaded struct {
	tx      *lockedTx
	now     time.Time
	tenants map[string]*tenant           // the batch's tenants and their ancestors, locked
	models  map[[2]string]*modelBucket   // by tenant and model key
	pools   map[string]*rule.Pool        // locked, by id
	routes  map[string]string            // model key -> pool id
	keys    map[string]liveKey           // unrevoked tenant keys, by id
	gws     map[string][]string          // unrevoked gateways' scopes, by id
	priors  map[[2]string]*prior         // reserves' live idempotency keys, by tenant and key
	adms    map[string]*Admission        // admissions settles and releases name, locked, by id
	named   map[[2]string]string         // admission ids named by (tenant, idempotency key)
	overdue map[string][]*Admission      // overdue reservations, locked, by tenant
	prices  *estimator.PriceBook         // current as of the lock round trip
	toBook  map[string][]LeasedAdmission // lease -> its admissions to book before the batch's ends (leasebook.go)
	pre     *writes                      // the writes of leases booked in the load step
}

// liveKey is an unrevoked tenant key, as a decision checks it.
type liveKey struct {
	tenantID string
	priority rule.Priority
	models   []string // the key's model scope (empty: every model)
}

// wants is what a batch's requests need read, gathered from its items once.
type wants struct {
	tenants     []string   // sorted
	admissions  []string   // settled or released by id, sorted
	byID        tenantKeys // (tenant, admission id) pairs settled or released by id
	namedBy     tenantKeys // settled or released by idempotency key
	keys        []string   // tenant keys the requests came with
	gateways    []string   // gateways the requests came through
	idempotency tenantKeys // the reserves' idempotency keys
	expiring    []string   // sorted
	modelKeys   []string   // the reserves' model keys
}

// tenantKeys are (tenant, idempotency key) pairs, as two arrays for
// unnest.
type tenantKeys struct{ tenants, keys []string }

func (p *tenantKeys) add(tenantID, key string) {
	p.tenants, p.keys = append(p.tenants, tenantID), append(p.keys, key)
}

// wantsOf gathers what items need read, each name once: the tenants (and,
// through lockTenants, their ancestors), the admissions named by id or key,
// the keys and gateways to check, the reserves' idempotency keys and model
// keys, the tenants to expire.
func wantsOf(items []Item) wants {
	var w wants
	seen := map[string]bool{}
	once := func(kind, id string) bool {
		k := kind + "\x00" + id
		if id == "" || seen[k] {
			return false
		}
		seen[k] = true
		return true
	}
	for _, it := range items {
		op := it.Op
		if once("tenant", it.TenantID) {
			w.tenants = append(w.tenants, it.TenantID)
		}
		if op.invalid != nil || op.answered != nil {
			continue // refused before it is decided: nothing of it is read
		}
		if op.Expire != nil && once("expire", it.TenantID) {
			w.expiring = append(w.expiring, it.TenantID)
		}
		if id := op.keyID(); once("key", id) {
			w.keys = append(w.keys, id)
		}
		if id := op.gatewayID(); once("gateway", id) {
			w.gateways = append(w.gateways, id)
		}
		if id := op.admissionID(); once("admission", id) {
			w.admissions = append(w.admissions, id)
		}
		if id := op.admissionID(); id != "" && once("admission of", it.TenantID+"\x00"+id) {
			w.byID.add(it.TenantID, id)
		}
		if k := op.admissionKey(); k != "" && once("named", it.TenantID+"\x00"+k) {
			w.namedBy.add(it.TenantID, k)
		}
		if r := op.Reserve; r != nil {
			if k := ModelKey(r.Estimate); once("model", k) {
				w.modelKeys = append(w.modelKeys, k)
			}
			if r.IdempotencyKey != "" && once("idempotency", it.TenantID+"\x00"+r.IdempotencyKey) {
				w.idempotency.add(it.TenantID, r.IdempotencyKey)
			}
		}
	}
	sort.Strings(w.tenants)
	sort.Strings(w.admissions)
	sort.Strings(w.expiring)
	return w
}

// load locks the batch's tenants and reads everything its requests need in
// the same round trip; rarely, a read this replica could not foresee
// (model limits or pools it had not seen) costs one more. It returns the
// state brought to the database's now. The caller must commit or abort
// l.tx.
func (s *Store) load(ctx context.Context, items []Item) (*loaded, error) {
	w := wantsOf(items)
	// Pools cost nothing where there are none: their statements are queued
	// only when some model draws on a pool.
	routes, err := s.poolRoutes(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.periodAlertRules(ctx); err != nil {
		return nil, err
	}
	l := &loaded{routes: routes, keys: map[string]liveKey{}, gws: map[string][]string{}, priors: map[[2]string]*prior{},
		adms: map[string]*Admission{}, named: map[[2]string]string{}, overdue: map[string][]*Admission{}}
	queueModels := s.modelQueue(w.tenants)
	reads := l.reads(w, queueModels, s.clock())
	if locks := s.keyLocks(w); len(locks) > 0 {
		reads = append(locks, reads...) // keys locked before they are read
	}
	tx, ts, now, err := s.lockTenants(ctx, w.tenants,
		func(b *pgx.Batch) {
			for _, r := range reads {
				r.queue(b)
			}
		},
		func(br pgx.BatchResults) error {
			for _, r := range reads {
				if err := r.scan(br); err != nil {
					return err
				}
			}
			return nil
		})
	if err != nil {
		return nil, err
	}
	l.tx, l.tenants, l.now = tx, ts, now
	if err := s.groupCopy(ctx, l, w, s.clock()); err != nil {
		tx.abort()
		return nil, err
	}
	if err := s.loadLate(ctx, l, w.tenants, queueModels); err != nil {
		tx.abort()
		return nil, err
	}
	if l.prices, err = s.priceBookFor(ctx, tx); err != nil {
		tx.abort()
		return nil, err
	}
	if err := s.bookLeases(l); err != nil {
		tx.abort()
		return nil, err
	}
	for _, m := range l.models {
		m.Advance(now)
	}
	for _, p := range l.pools {
		p.Tokens.Refill(now)
	}
	return l, nil
}

// reads are the batch's reads after its tenant locks, in lock order. A
// read nothing needs is not queued. clock is the store's clock override
// (Store.clock), for the reads that compare with the time.
func (l *loaded) reads(w wants, queueModels bool, clock *time.Time) []read {
	var rs []read
	if queueModels {
		rs = append(rs, modelLimitsRead{tenants: w.tenants, l: l})
	}
	if len(w.keys) > 0 {
		rs = append(rs, keyLiveRead{ids: w.keys, l: l})
	}
	if len(w.gateways) > 0 {
		rs = append(rs, gatewayLiveRead{ids: w.gateways, l: l})
	}
	if len(w.idempotency.keys) > 0 {
		rs = append(rs, idempotencyRead{pairs: w.idempotency, clock: clock, l: l})
	}
	if len(w.admissions) > 0 || len(w.namedBy.keys) > 0 {
		rs = append(rs, admissionLockRead{ids: w.admissions, namedBy: w.namedBy, clock: clock, l: l},
			leaseBookRead{ids: w.admissions, namedBy: w.namedBy, clock: clock, l: l})
	}
	if len(w.expiring) > 0 {
		rs = append(rs, admissionExpiredRead{tenants: w.expiring, clock: clock, l: l})
	}
	var poolIDs []string
	for _, k := range w.modelKeys {
		if id, ok := l.routes[k]; ok && !slices.Contains(poolIDs, id) {
			poolIDs = append(poolIDs, id)
		}
	}
	if len(poolIDs) > 0 || len(l.routes) > 0 && (len(w.admissions) > 0 || len(w.namedBy.keys) > 0) {
		rs = append(rs, poolsRead{ids: poolIDs, admissions: w.admissions, namedBy: w.namedBy, l: l})
	}
	return rs
}

// loadLate reads, after the lock round trip, what this replica could not
// know to queue in it: the model limits of tenants it had not seen with
// any (and it stops reading them for tenants that have none any more), and
// the pools of ended admissions whose routes it had not read yet.
func (s *Store) loadLate(ctx context.Context, l *loaded, ids []string, queuedModels bool) error {
	have := modelTenantsOf(ids, l.tenants)
	for _, id := range have {
		s.modelTenants.Store(id, true)
	}
	if !queuedModels && len(have) > 0 {
		var err error
		if l.models, err = l.tx.readModelsLate(ctx, have); err != nil {
			return err
		}
	}
	if queuedModels && len(have) < len(ids) { // limits removed since: stop reading them
		for _, id := range ids {
			if !slices.Contains(have, id) {
				s.modelTenants.Delete(id)
			}
		}
	}
	var late []string
	for _, a := range l.adms {
		if a.PoolID != "" && l.pools[a.PoolID] == nil && !slices.Contains(late, a.PoolID) {
			late = append(late, a.PoolID)
		}
	}
	if len(late) == 0 {
		return nil
	}
	if l.pools == nil {
		l.pools = map[string]*rule.Pool{}
	}
	sort.Strings(late)
	return l.tx.lockPoolsLate(ctx, late, l.pools)
}

// eachRow scans the rows of the next result into dest and calls fn after
// each; what names the read in its error.
func eachRow(br pgx.BatchResults, what string, dest []any, fn func()) error {
	rows, err := br.Query()
	if err == nil {
		_, err = pgx.ForEachRow(rows, dest, func() error { fn(); return nil })
	}
	if err != nil {
		return fmt.Errorf("budget: %s: %w", what, err)
	}
	return nil
}

// modelLimitsRead reads the model limits of the batch's tenants and their
// ancestors (model_limits_lock.sql).
type modelLimitsRead struct {
	tenants []string
	l       *loaded
}

func (r modelLimitsRead) queue(b *pgx.Batch) { b.Queue(modelLimitsLockSQL, r.tenants) }

func (r modelLimitsRead) scan(br pgx.BatchResults) error {
	var err error
	r.l.models, err = scanModelBuckets(br.Query())
	return err
}

// keyLiveRead reads which of the tenant keys the requests came with are
// unrevoked, with their tenant and priority (key_live.sql).
type keyLiveRead struct {
	ids []string
	l   *loaded
}

func (r keyLiveRead) queue(b *pgx.Batch) { b.Queue(keyLiveSQL, r.ids) }

func (r keyLiveRead) scan(br pgx.BatchResults) error {
	var id, tenantID, priority string
	var models []string
	return eachRow(br, "keys", []any{&id, &tenantID, &priority, &models}, func() {
		r.l.keys[id] = liveKey{tenantID: tenantID, priority: rule.Priority(priority), models: slices.Clone(models)}
	})
}

// gatewayLiveRead reads which of the gateways the requests came through are
// unrevoked, with their scopes (gateway_live.sql).
type gatewayLiveRead struct {
	ids []string
	l   *loaded
}

func (r gatewayLiveRead) queue(b *pgx.Batch) { b.Queue(gatewayLiveSQL, r.ids) }

func (r gatewayLiveRead) scan(br pgx.BatchResults) error {
	var id string
	var scope []string
	return eachRow(br, "gateways", []any{&id, &scope}, func() { r.l.gws[id] = scope })
}

// idempotencyRead reads the reserves' live Idempotency-Keys, by tenant and
// key (idempotency_get.sql).
type idempotencyRead struct {
	pairs tenantKeys
	clock *time.Time
	l     *loaded
}

func (r idempotencyRead) queue(b *pgx.Batch) {
	b.Queue(idempotencyGetSQL, r.pairs.tenants, r.pairs.keys, r.clock)
}

func (r idempotencyRead) scan(br pgx.BatchResults) error {
	var tenantID, key string
	var pr prior
	return eachRow(br, "idempotency keys", []any{&tenantID, &key, &pr.admissionID, &pr.hash, &pr.response}, func() {
		p := pr
		r.l.priors[[2]string{tenantID, key}] = &p
	})
}

// admissionLockRead locks the admissions that settles and releases name,
// by id or by a tenant's live Idempotency-Key, in one statement in id
// order (admission_lock.sql).
type admissionLockRead struct {
	ids     []string
	namedBy tenantKeys
	clock   *time.Time
	l       *loaded
}

func (r admissionLockRead) queue(b *pgx.Batch) {
	b.Queue(admissionLockSQL, r.ids, r.namedBy.tenants, r.namedBy.keys, r.clock)
}

// namedAdmissionRow is an admission row and the keys that named it.
type namedAdmissionRow struct {
	admissionRow
	NamedBy []string `db:"named_by"`
}

func (r admissionLockRead) scan(br pgx.BatchResults) error {
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("budget: lock admissions: %w", err)
	}
	rs, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[namedAdmissionRow])
	if err != nil {
		return fmt.Errorf("budget: lock admissions: %w", err)
	}
	for _, row := range rs {
		a := row.admission()
		r.l.adms[a.ID] = a
		for _, k := range row.NamedBy {
			r.l.named[[2]string{a.TenantID, k}] = a.ID
		}

	}
	return nil
}

// admissionExpiredRead locks up to sweepBatch overdue reservations of each
// tenant the batch expires (admission_expired_lock.sql).
type admissionExpiredRead struct {
	tenants []string
	clock   *time.Time
	l       *loaded
}

func (r admissionExpiredRead) queue(b *pgx.Batch) {
	b.Queue(admissionExpiredLockSQL, r.tenants, sweepBatch, r.clock)
}

func (r admissionExpiredRead) scan(br pgx.BatchResults) error {
	as, err := scanAdmissions(br.Query())
	if err != nil {
		return err
	}
	for _, a := range as {
		r.l.overdue[a.TenantID] = append(r.l.overdue[a.TenantID], a)
	}
	return nil
}

// poolsRead locks the pools the reserves' models route to and those the
// ended admissions drew on, in id order, then reads their shares
// (pool_lock.sql, pool_shares_get.sql).
type poolsRead struct {
	ids, admissions []string
	namedBy         tenantKeys
	l               *loaded
}

func (r poolsRead) queue(b *pgx.Batch) {
	b.Queue(poolLockSQL, r.ids, r.admissions, r.namedBy.tenants, r.namedBy.keys)
	b.Queue(poolSharesGetSQL, r.ids, r.admissions, r.namedBy.tenants, r.namedBy.keys)
}

func (r poolsRead) scan(br pgx.BatchResults) error {
	var err error
	r.l.pools, err = scanPools(br)
	return err
}
