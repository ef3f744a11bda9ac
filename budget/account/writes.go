package account

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tokengate/tokengate/budget/alert"
	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
	"github.com/tokengate/tokengate/ledger/pgarray"
)

var (
	//go:embed sql/tenant_update.sql
	tenantUpdateSQL string
	//go:embed sql/admission_insert.sql
	admissionInsertSQL string
	//go:embed sql/admission_end.sql
	admissionEndSQL string
	//go:embed sql/idempotency_put.sql
	idempotencyPutSQL string
)

// writes is what a transaction changes, collected while deciding and sent
// as one multi-row statement per table (arrays through unnest) in the round
// trip that commits: a batch of any size costs the same round trips.
type writes struct {
	tenants  []*tenant
	entries  []*ledger.Entry
	inserted []*Admission
	ended    []*Admission
	keys     []keyPut
	deferred []deferredEnd // settles and releases kept for an admission not replayed yet
	models   []*modelBucket
	pools    map[string]*rule.Pool // the batch's locked pools; those changed are written
	// alerts: queue the threshold statement (some period_budget rule may
	// exist); set by commit from the store.
	alerts bool
	extra  []write // statements of admin operations, before the rest
	after  []write // statements that refer to the rows above, after them
}

type keyPut struct {
	tenantID, key, admissionID string
	hash, response             []byte
	at                         time.Time
}

type write struct {
	sql    string
	args   []any
	expect int64 // rows it must affect; -1: any
}

func (w *writes) empty() bool {
	return len(w.entries) == 0 && len(w.extra) == 0 && len(w.after) == 0 && len(w.models) == 0 && len(w.deferred) == 0
}

// changed records that t's balances or chain head must be written.
func (w *writes) changed(t *tenant) {
	for _, seen := range w.tenants {
		if seen == t {
			return
		}
	}
	w.tenants = append(w.tenants, t)
}

// end records an admission's new end state. An admission ended twice in
// one batch (expired, then settled late) is written once, as it ends up:
// the statement updates each row once.
func (w *writes) end(a *Admission) {
	for i, e := range w.ended {
		if e.ID == a.ID {
			w.ended[i] = a
			return
		}
	}
	w.ended = append(w.ended, a)
}

// model records that a model bucket changed.
func (w *writes) model(m *modelBucket) {
	if !slices.Contains(w.models, m) {
		w.models = append(w.models, m)
	}
}

// entry records a sealed entry of t, and that t changed.
func (w *writes) entry(t *tenant, e *ledger.Entry) {
	w.changed(t)
	w.entries = append(w.entries, e)
}

// statement adds an admin operation's own statement, which must affect
// expect rows (-1: any).
func (w *writes) statement(expect int64, sql string, args ...any) {
	w.extra = append(w.extra, write{sql: sql, args: args, expect: expect})
}

// batch lays the writes out in order: admin statements, the tenant rows,
// the ledger, then the rows the entries name (admissions before the keys
// that refer to them).
func (w *writes) batch() (*pgx.Batch, []int64) {
	b := &pgx.Batch{}
	var expect []int64
	for _, x := range w.extra {
		b.Queue(x.sql, x.args...)
		expect = append(expect, x.expect)
	}
	if n := len(w.tenants); n > 0 {
		ids, tokens, tokensAt, open, seq := make([]string, n), make([]int64, n), make([]time.Time, n), make([]int64, n), make([]int64, n)
		reqs, reqsAt, usage, hash := make([]*int64, n), make([]*time.Time, n), make([]*string, n), make([][]byte, n)
		for i, t := range w.tenants {
			ids[i], tokens[i], tokensAt[i], open[i], seq[i] = t.id, t.Tokens.BalanceMicro, t.Tokens.At, t.Open, t.head.Seq
			if t.Requests.CapacityMicro > 0 {
				reqs[i], reqsAt[i] = &t.Requests.BalanceMicro, &t.Requests.At
			}
			if u := rule.EncodeUsage(t.Limits.Windows, t.TenantState.Windows); u != nil {
				s := string(u)
				usage[i] = &s
			}
			hash[i] = t.head.Hash
		}
		b.Queue(tenantUpdateSQL, pgarray.Texts(ids), pgarray.Int8s(tokens), pgarray.Timestamptzs(tokensAt), pgarray.NullInt8s(reqs),
			pgarray.NullTimestamptzs(reqsAt), pgarray.Int8s(open), pgarray.NullTexts(usage), pgarray.Int8s(seq), pgarray.Byteas(hash))
		expect = append(expect, int64(n))
		if args := w.crossings(); w.alerts && args != nil {
			b.Queue(alert.ThresholdsCrossedSQL, args...)
			expect = append(expect, -1)
		}
	}
	if n := len(w.models); n > 0 {
		tenants, models, in, inAt, out, outAt := make([]string, n), make([]string, n), make([]int64, n), make([]time.Time, n), make([]int64, n), make([]time.Time, n)
		for i, m := range w.models {
			tenants[i], models[i], in[i], inAt[i], out[i], outAt[i] = m.tenantID, m.Model, m.In.BalanceMicro, m.In.At, m.Out.BalanceMicro, m.Out.At
		}
		b.Queue(modelLimitsUpdateSQL, tenants, models, in, inAt, out, outAt)
		expect = append(expect, int64(n))
	}
	expect = append(expect, writePools(b, w.pools)...)
	if len(w.entries) > 0 {
		expect = append(expect, int64(ledger.QueueInsert(b, w.entries...)))
	}
	if n := len(w.inserted); n > 0 {
		ids, tenants, models := make([]string, n), make([]string, n), make([]string, n)
		in, out, cost, inW, outW := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
		approx, created, expires, shadowed := make([]bool, n), make([]time.Time, n), make([]time.Time, n), make([]string, n)
		families, modelLevels, pools := make([]string, n), make([]string, n), make([]string, n)
		priceModels, priceFrom, money := make([]string, n), make([]*time.Time, n), make([]*int64, n)
		faces, debited, priceTiers := make([]string, n), make([]*int64, n), make([]string, n)
		for i, a := range w.inserted {
			priceModels[i], priceFrom[i], money[i], priceTiers[i] = a.PriceModel, a.PriceFrom, a.MoneyEstimate, a.PriceTier
			faces[i], debited[i] = string(a.Face.Or()), a.DebitedMicro
			e := a.Estimate
			shadowed[i], families[i], modelLevels[i] = strings.Join(a.Shadowed, ","), a.Family, strings.Join(a.ModelLevels, ",")
			pools[i] = a.PoolID
			ids[i], tenants[i], models[i], created[i], expires[i] = a.ID, a.TenantID, e.Model, a.CreatedAt, a.ExpiresAt
			in[i], out[i], cost[i], approx[i], inW[i], outW[i] = e.InputTokens, e.OutputTokens, e.Cost, e.Approximate, e.InputWeightMicro, e.OutputWeightMicro
		}
		b.Queue(admissionInsertSQL, pgarray.Texts(ids), pgarray.Texts(tenants), pgarray.Texts(models), pgarray.Int8s(in), pgarray.Int8s(out),
			pgarray.Int8s(cost), approx, pgarray.Int8s(inW), pgarray.Int8s(outW), pgarray.Timestamptzs(created), pgarray.Timestamptzs(expires),
			pgarray.Texts(shadowed), pgarray.Texts(families), pgarray.Texts(modelLevels), pgarray.Texts(pools), pgarray.Texts(priceModels),
			pgarray.NullTimestamptzs(priceFrom), pgarray.NullInt8s(money), pgarray.Texts(faces), pgarray.NullInt8s(debited), pgarray.Texts(priceTiers))
		expect = append(expect, int64(n))
	}
	if n := len(w.ended); n > 0 {
		ids, states, ended, late := make([]string, n), make([]string, n), make([]*time.Time, n), make([]bool, n)
		in, out, cost, delta, balance := make([]*int64, n), make([]*int64, n), make([]*int64, n), make([]*int64, n), make([]*int64, n)
		money := make([]*int64, n)
		for i, a := range w.ended {
			money[i] = a.MoneyActual
			ids[i], states[i], ended[i], late[i] = a.ID, string(a.State), a.EndedAt, a.Late
			in[i], out[i], cost[i], delta[i], balance[i] = a.ActualInput, a.ActualOutput, a.ActualCost, a.EndDeltaMicro, a.EndBalanceMicro
		}
		b.Queue(admissionEndSQL, pgarray.Texts(ids), pgarray.Texts(states), pgarray.NullTimestamptzs(ended), late, pgarray.NullInt8s(in),
			pgarray.NullInt8s(out), pgarray.NullInt8s(cost), pgarray.NullInt8s(delta), pgarray.NullInt8s(balance), pgarray.NullInt8s(money))
		expect = append(expect, int64(n))
	}
	if n := len(w.keys); n > 0 {
		tenants, keys, adms, hashes, responses, at := make([]string, n), make([]string, n), make([]string, n), make([][]byte, n), make([][]byte, n), make([]time.Time, n)
		for i, k := range w.keys {
			tenants[i], keys[i], adms[i], hashes[i], responses[i], at[i] = k.tenantID, k.key, k.admissionID, k.hash, k.response, k.at
		}
		b.Queue(idempotencyPutSQL, pgarray.Texts(tenants), pgarray.Texts(keys), pgarray.Texts(adms), pgarray.Byteas(hashes),
			pgarray.Byteas(responses), pgarray.Timestamptzs(at))
		expect = append(expect, int64(n))
	}
	if len(w.deferred) > 0 {
		queueDeferred(b, w.deferred)
		expect = append(expect, -1) // up to 8 rows of a key
	}
	for _, x := range w.after {
		b.Queue(x.sql, x.args...)
		expect = append(expect, x.expect)
	}
	return b, expect
}

// crossings are the window usage rises of this transaction's tenants, for
// the alert thresholds they may cross (nil if none rose).
func (w *writes) crossings() []any {
	var c alert.Crossings
	for _, t := range w.tenants {
		for i, win := range t.Limits.Windows {
			if i >= len(t.TenantState.Windows) || t.TenantState.Windows[i].Start == nil {
				continue
			}
			u := t.TenantState.Windows[i]
			before := int64(0)
			if i < len(t.locked) && t.locked[i].Start != nil && t.locked[i].Start.Equal(*u.Start) {
				before = t.locked[i].Used
			}
			c.Add(alert.Crossing{Tenant: t.id, Window: win.Name, Counts: string(win.Counts), Before: before, After: u.Used,
				Limit: win.Limit, Start: *u.Start, End: win.Next(*u.Start), Thresholds: win.AlertThresholds()})
		}
	}
	return c.Args()
}

// commit sends w and COMMIT in one round trip and releases the connection;
// with nothing to write it only rolls back, which releases the locks
// without a WAL flush. Each statement must affect exactly the rows it
// names: an update that matched fewer is a bug, and nothing is committed.
//
// Once the locks are held and the decisions made, giving up because the
// caller's time ran out helps no one: the work is done, and abandoning it
// mid-commit turns decisions into unknown outcomes. So the write phase
// ignores ctx's deadline and gets as long as the lock phase was allowed.
func (tx *lockedTx) commit(ctx context.Context, w *writes) error {
	if w == nil || w.empty() {
		tx.abort()
		return nil
	}
	if tx.allowance > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), tx.allowance)
		defer cancel()
	}
	w.alerts = tx.store.periodAlerts.On()
	b, expect := w.batch()
	b.Queue("COMMIT")
	expect = append(expect, -1)
	countTrip(ctx)
	br := tx.conn.SendBatch(ctx, b)
	var err error
	for i := range b.Len() {
		var tag pgconn.CommandTag
		tag, err = br.Exec()
		if err != nil {
			break
		}
		if expect[i] >= 0 && tag.RowsAffected() != expect[i] {
			err = fmt.Errorf("statement %d affected %d rows, not %d", i+1, tag.RowsAffected(), expect[i])
			break
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		tx.abort()
		return tx.store.classify(ctx, fmt.Errorf("budget: write: %w", err), false, true, tx.since)
	}
	tx.store.noteAnswer()
	tx.open = false
	tx.conn.Release()
	tx.conn = nil
	return nil
}
