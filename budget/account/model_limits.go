package account

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/estimator"
	"github.com/tokengate/tokengate/ledger"
)

var (
	//go:embed sql/tenant_model_limits_count.sql
	tenantModelLimitsCountSQL string
	//go:embed sql/model_limits_lock.sql
	modelLimitsLockSQL string
	//go:embed sql/model_limits_update.sql
	modelLimitsUpdateSQL string
	//go:embed sql/model_limits_upsert.sql
	modelLimitsUpsertSQL string
	//go:embed sql/model_limits_delete.sql
	modelLimitsDeleteSQL string
	//go:embed sql/model_limits_list.sql
	modelLimitsListSQL string
)

// ModelKey is what model limits and pool routes are keyed by for an estimate: its model
// table entry, or the requested name for a model the table does not know.
func ModelKey(e estimator.Estimate) string {
	if e.Family == "" || e.Family == estimator.UnknownFamily {
		return e.Model
	}
	return e.Family
}

// modelBucket is one tenant's buckets for one model, as a decision holds
// them under the tenant's lock.
type modelBucket struct {
	tenantID string
	rule.ModelState
	changed bool
}

// debit is ModelState.Debit, marking the bucket for writing.
func (m *modelBucket) debit(in, out int64, skip rule.LimitSet) {
	m.Debit(in, out, skip)
	m.changed = true
}

// end is ModelState.End, marking the bucket for writing.
func (m *modelBucket) end(estIn, estOut, in, out int64, skip rule.LimitSet) {
	m.End(estIn, estOut, in, out, skip)
	m.changed = true
}

// modelRow is a row of tenant_model_limits, by column name.
type modelRow struct {
	TenantID        string    `db:"tenant_id"`
	Model           string    `db:"model"`
	InputCapacity   *int64    `db:"input_capacity"`
	InputRateMicro  *int64    `db:"input_rate_micro"`
	OutputCapacity  *int64    `db:"output_capacity"`
	OutputRateMicro *int64    `db:"output_rate_micro"`
	InputMicro      int64     `db:"input_micro"`
	InputAt         time.Time `db:"input_at"`
	OutputMicro     int64     `db:"output_micro"`
	OutputAt        time.Time `db:"output_at"`
	ShadowLimits    []string  `db:"shadow_limits"`
}

func (r *modelRow) bucket() *modelBucket {
	m := &modelBucket{tenantID: r.TenantID, ModelState: rule.ModelState{ModelLimits: rule.ModelLimits{Model: r.Model,
		InputCapacity: deref0(r.InputCapacity), InputRateMicro: deref0(r.InputRateMicro),
		OutputCapacity: deref0(r.OutputCapacity), OutputRateMicro: deref0(r.OutputRateMicro)}}}
	m.Shadow, _ = rule.ParseLimitSet("shadow", r.ShadowLimits)
	m.In = rule.Bucket{CapacityMicro: m.InputCapacity * rule.Micro, RateMicro: m.InputRateMicro, BalanceMicro: r.InputMicro, At: r.InputAt}
	m.Out = rule.Bucket{CapacityMicro: m.OutputCapacity * rule.Micro, RateMicro: m.OutputRateMicro, BalanceMicro: r.OutputMicro, At: r.OutputAt}
	return m
}

func scanModelBuckets(rows pgx.Rows, err error) (map[[2]string]*modelBucket, error) {
	if err != nil {
		return nil, err
	}
	rs, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[modelRow])
	if err != nil {
		return nil, fmt.Errorf("budget: scan model limits: %w", err)
	}
	out := make(map[[2]string]*modelBucket, len(rs))
	for _, r := range rs {
		out[[2]string{r.TenantID, r.Model}] = r.bucket()
	}
	return out, nil
}

// modelTenantsOf is which of a batch's tenants have model limits at some
// level of their tree, as the locked rows say.
func modelTenantsOf(ids []string, ts map[string]*tenant) []string {
	var out []string
	for _, id := range ids {
		t, ok := ts[id]
		if !ok {
			continue
		}
		has := t.modelLimits > 0
		for _, a := range t.path {
			if at, ok := ts[a]; ok && at.modelLimits > 0 {
				has = true
			}
		}
		if has {
			out = append(out, id)
		}
	}
	return out
}

// modelQueue says whether a batch reads model limits in its first round
// trip: when this replica saw that one of its tenants has some. A tenant
// it has not seen with them yet costs the batch a second round trip, once.
func (s *Store) modelQueue(ids []string) bool {
	for _, id := range ids {
		if _, ok := s.modelTenants.Load(id); ok {
			return true
		}
	}
	return false
}

// readModelsLate reads model limits in a decision's transaction, after
// the locks (a tenant this replica had not seen with model limits).
func (tx *lockedTx) readModelsLate(ctx context.Context, ids []string) (map[[2]string]*modelBucket, error) {
	countTrip(ctx)
	m, err := scanModelBuckets(tx.conn.Query(ctx, modelLimitsLockSQL, ids))
	if err != nil {
		return nil, tx.store.classify(ctx, fmt.Errorf("budget: model limits: %w", err), false, false, tx.since)
	}
	return m, nil
}

// detail is how an entry that changed the buckets records them, so that
// an auditor sees each model bucket's balance after every change.
func (m *modelBucket) detail() string {
	return fmt.Sprintf(`"model_limits":%q,"input_micro":%d,"output_micro":%d`, m.Model, m.In.BalanceMicro, m.Out.BalanceMicro)
}

func (m *modelBucket) snapshot(now time.Time) rule.ModelSnapshot {
	return rule.ModelSnapshot{TenantID: m.tenantID, Limits: m.ModelLimits, InputMicro: m.In.BalanceMicro, OutputMicro: m.Out.BalanceMicro, At: now}
}

type modelLimitsDetail struct {
	InputCapacity   int64    `json:"input_tokens_capacity,omitempty"`
	InputPerSecond  string   `json:"input_tokens_per_second,omitempty"`
	OutputCapacity  int64    `json:"output_tokens_capacity,omitempty"`
	OutputPerSecond string   `json:"output_tokens_per_second,omitempty"`
	Shadow          []string `json:"shadow,omitempty"`
}

func modelDetailOf(m *rule.ModelLimits) *modelLimitsDetail {
	if m == nil {
		return nil
	}
	d := &modelLimitsDetail{InputCapacity: m.InputCapacity, OutputCapacity: m.OutputCapacity}
	if m.InputRateMicro > 0 {
		d.InputPerSecond = rule.FormatRate(m.InputRateMicro)
	}
	if m.OutputRateMicro > 0 {
		d.OutputPerSecond = rule.FormatRate(m.OutputRateMicro)
	}
	if m.Shadow != 0 {
		d.Shadow = m.Shadow.Strings()
	}
	return d
}

// SetModelLimitsParams sets (creates or replaces) a tenant's limits for a
// model.
type SetModelLimitsParams struct {
	TenantID string
	Limits   rule.ModelLimits
	Actor    string
}

// SetModelLimits sets a tenant's limits for one model under the tenant's
// row lock, so the next admission in every replica decides with them, and
// appends a limits entry with the model's limits before and after. A new
// bucket starts full; a kept one is refilled to now at the old rate and cut
// to a lowered capacity. It returns a *LimitError or ErrTenantNotFound.
func (s *Store) SetModelLimits(ctx context.Context, p SetModelLimitsParams) (rule.ModelSnapshot, error) {
	if err := p.Limits.Validate(); err != nil {
		return rule.ModelSnapshot{}, err
	}
	return s.changeModelLimits(ctx, p.TenantID, p.Limits.Model, &p.Limits, p.Actor)
}

// RemoveModelLimits removes a tenant's limits for a model, with a limits
// entry. It returns ErrModelLimitsNotFound or ErrTenantNotFound.
func (s *Store) RemoveModelLimits(ctx context.Context, tenantID, model, actor string) error {
	_, err := s.changeModelLimits(ctx, tenantID, model, nil, actor)
	return err
}

func (s *Store) changeModelLimits(ctx context.Context, tenantID, model string, l *rule.ModelLimits, actor string) (rule.ModelSnapshot, error) {
	var cur map[[2]string]*modelBucket
	tx, t, now, err := s.lockTenant(ctx, tenantID,
		func(b *pgx.Batch) { b.Queue(modelLimitsLockSQL, []string{tenantID}) },
		func(br pgx.BatchResults) error {
			var err error
			cur, err = scanModelBuckets(br.Query())
			return err
		})
	if err != nil {
		return rule.ModelSnapshot{}, err
	}
	t.advance(now)
	old := cur[[2]string{tenantID, model}]
	if old == nil && l == nil {
		tx.abort()
		return rule.ModelSnapshot{}, rule.ErrModelLimitsNotFound
	}
	var before *rule.ModelLimits
	if old != nil {
		old.Advance(now)
		before = &old.ModelLimits
	}
	detail, err := json.Marshal(struct {
		Model  string             `json:"model"`
		Before *modelLimitsDetail `json:"before"`
		After  *modelLimitsDetail `json:"after"`
	}{model, modelDetailOf(before), modelDetailOf(l)})
	if err != nil {
		tx.abort()
		return rule.ModelSnapshot{}, fmt.Errorf("budget: encode model limits: %w", err)
	}
	w := &writes{}
	var snap rule.ModelSnapshot
	switch {
	case l == nil:
		w.statement(1, modelLimitsDeleteSQL, tenantID, model)
		w.statement(1, tenantModelLimitsCountSQL, tenantID, -1)
	case old == nil:
		w.statement(1, tenantModelLimitsCountSQL, tenantID, 1)
	}
	if l != nil {
		m := &modelBucket{tenantID: tenantID, ModelState: rule.ModelState{ModelLimits: *l}}
		m.In = rule.Bucket{CapacityMicro: l.InputCapacity * rule.Micro, RateMicro: l.InputRateMicro, BalanceMicro: l.InputCapacity * rule.Micro, At: now}
		m.Out = rule.Bucket{CapacityMicro: l.OutputCapacity * rule.Micro, RateMicro: l.OutputRateMicro, BalanceMicro: l.OutputCapacity * rule.Micro, At: now}
		if old != nil { // keep what was spent, within the new capacity
			if old.InputCapacity > 0 && l.InputCapacity > 0 {
				m.In.BalanceMicro = min(old.In.BalanceMicro, m.In.CapacityMicro)
			}
			if old.OutputCapacity > 0 && l.OutputCapacity > 0 {
				m.Out.BalanceMicro = min(old.Out.BalanceMicro, m.Out.CapacityMicro)
			}
		}
		w.statement(1, modelLimitsUpsertSQL, tenantID, model, l.InputCapacity, l.InputRateMicro, l.OutputCapacity,
			l.OutputRateMicro, m.In.BalanceMicro, m.Out.BalanceMicro, now, l.Shadow.Strings())
		snap = m.snapshot(now)
	}
	if l != nil {
		s.modelTenants.Store(tenantID, true) // this replica reads them from the next decision on
	}
	e := t.entry(ledger.KindLimits, now, actorOr(actor, "admin"))
	e.Reason = "model limits: " + model
	e.Detail = string(detail)
	t.seal(e)
	w.entry(t, e)
	if err := tx.commit(ctx, w); err != nil {
		return rule.ModelSnapshot{}, err
	}
	return snap, nil
}

// ModelLimitsList returns a tenant's model limits with their balances
// refilled to the database's clock now, without locking.
func (s *Store) ModelLimitsList(ctx context.Context, tenantID string) ([]rule.ModelSnapshot, error) {
	return readNow(ctx, s, "model limits", modelLimitsListSQL, []any{tenantID}, func(r *modelRow, now time.Time) rule.ModelSnapshot {
		m := r.bucket()
		m.Advance(now)
		return m.snapshot(now)
	})
}
