package account

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

var (
	//go:embed sql/tenant_update_limits.sql
	tenantUpdateLimitsSQL string
	//go:embed sql/tenant_set_disabled.sql
	tenantSetDisabledSQL string
	//go:embed sql/tenant_list.sql
	tenantListSQL string
	//go:embed sql/tenant_tree.sql
	tenantTreeSQL string
)

// UpdateLimitsParams changes some of a tenant's limits.
type UpdateLimitsParams struct {
	TenantID string
	// Patch names the fields to change; the others keep their value.
	Patch rule.LimitsPatch
	Actor string
	// LevelsFunc, when set, runs after the change under the same locks and
	// in its transaction, its moves applied as LockedLevels applies them:
	// budget/admin ends the tenant's leases so (levelsIn).
	LevelsFunc LevelsFunc
}

// UpdateLimits applies a patch to a tenant's limits under its row lock, in
// one transaction with the limits entry, so that concurrent patches of
// different fields, from any replica, the CLI or the dashboard, never lose
// one another, and the next admission in every replica decides with the
// result. Balances are first refilled to now at the old rate. A balance
// above a lowered capacity is cut to it (the entry records the cut as its
// delta); a newly configured request bucket starts full; a changed period
// starts a fresh window. It appends a limits entry with the limits before
// and after, and returns a *LimitError (ErrInvalidLimits) or
// ErrTenantNotFound.
func (s *Store) UpdateLimits(ctx context.Context, p UpdateLimitsParams) (rule.Snapshot, error) {
	if err := p.Patch.Check(); err != nil {
		return rule.Snapshot{}, err
	}
	tx, ts, t, now, err := s.lockTree(ctx, p.TenantID)
	if err != nil {
		return rule.Snapshot{}, err
	}
	l := p.Patch.Apply(t.Limits)
	if err := l.Validate(); err != nil {
		tx.abort()
		return rule.Snapshot{}, err
	}
	w := &writes{}
	if err := t.relimit(l, now, actorOr(p.Actor, "admin"), w); err != nil {
		tx.abort()
		return rule.Snapshot{}, err
	}
	if err := levelsIn(ctx, tx, ts, t, now, p.LevelsFunc, w); err != nil {
		tx.abort()
		return rule.Snapshot{}, err
	}
	if err := tx.commit(ctx, w); err != nil {
		return rule.Snapshot{}, err
	}
	return t.snapshot(now), nil
}

// relimit sets t's limits (locked, read at now) to l, valid, and queues on
// w the limits row and a limits entry with the limits before and after:
// what UpdateLimits does to a tenant, and a template change to each end
// user (enduser.go).
func (t *tenant) relimit(l rule.Limits, now time.Time, actor string, w *writes) error {
	t.advance(now)
	before := t.Limits
	detail, err := json.Marshal(struct {
		Before rule.LimitsDetail `json:"before"`
		After  rule.LimitsDetail `json:"after"`
	}{before.Detail(), l.Detail()})
	if err != nil {
		return fmt.Errorf("budget: encode limits: %w", err)
	}

	t.Limits = l
	t.Tokens.CapacityMicro, t.Tokens.RateMicro = l.TokensCapacity*rule.Micro, l.TokensRateMicro
	var cut int64
	if t.Tokens.BalanceMicro > t.Tokens.CapacityMicro {
		cut = t.Tokens.CapacityMicro - t.Tokens.BalanceMicro
		t.Tokens.BalanceMicro = t.Tokens.CapacityMicro
	}
	switch {
	case l.RequestsCapacity == 0:
		t.Requests = rule.Bucket{}
	case before.RequestsCapacity == 0:
		t.Requests = rule.Bucket{CapacityMicro: l.RequestsCapacity * rule.Micro, RateMicro: l.RequestsRateMicro, BalanceMicro: l.RequestsCapacity * rule.Micro, At: now}
	default:
		t.Requests.CapacityMicro, t.Requests.RateMicro = l.RequestsCapacity*rule.Micro, l.RequestsRateMicro
		t.Requests.BalanceMicro = min(t.Requests.BalanceMicro, t.Requests.CapacityMicro)
	}
	// A window keeps what it used while its calendar stays the same (a
	// new limit, overage or thresholds); a new window, or one whose unit,
	// zone, reset or count changed, starts afresh now.
	usage := make([]rule.WindowUsage, len(l.Windows))
	for i, w := range l.Windows {
		start := w.Start(now)
		usage[i] = rule.WindowUsage{Start: &start}
		for j, old := range before.Windows {
			if old.Name == w.Name && old.SameCalendar(w) && j < len(t.TenantState.Windows) {
				usage[i] = t.TenantState.Windows[j]
			}
		}
	}
	t.TenantState.Windows = usage

	e := t.entry(ledger.KindLimits, now, actor)
	e.DeltaMicro = cut
	e.Detail = string(detail)
	t.seal(e)

	w.statement(1, tenantUpdateLimitsSQL, t.id, l.TokensCapacity, l.TokensRateMicro, l.RequestsCapacity, l.RequestsRateMicro,
		l.MaxConcurrent, rule.EncodeWindows(l.Windows), l.ReservationTTL.Milliseconds(), l.MaxWait.Milliseconds(),
		string(l.OnStoreUnavailable), l.Shadow.Strings())
	w.entry(t, e)
	return nil
}

// SetDisabledParams disables or re-enables a tenant.
type SetDisabledParams struct {
	TenantID string
	Disabled bool
	Reason   string
	Actor    string
	// LevelsFunc, when set, runs after the change under the same locks and
	// in its transaction, its moves applied as LockedLevels applies them:
	// budget/admin ends the tenant's leases so (levelsIn).
	LevelsFunc LevelsFunc
}

// SetDisabled disables a tenant (its admissions answer 403 and its keys stop
// working) or enables it again, with a tenant entry in the ledger. Setting
// the state it already has changes nothing. It returns ErrTenantNotFound.
func (s *Store) SetDisabled(ctx context.Context, p SetDisabledParams) (rule.Snapshot, error) {
	if len(p.Reason) > 500 {
		return rule.Snapshot{}, &rule.LimitError{Field: "reason", Reason: "at most 500 characters"}
	}
	tx, ts, t, now, err := s.lockTree(ctx, p.TenantID)
	if err != nil {
		return rule.Snapshot{}, err
	}
	t.advance(now)
	if t.disabled == p.Disabled {
		tx.abort()
		return t.snapshot(now), nil
	}
	t.disabled = p.Disabled
	var at *time.Time
	event := "enabled"
	if p.Disabled {
		at, event = &now, "disabled"
	}
	e := t.entry(ledger.KindTenant, now, actorOr(p.Actor, "admin"))
	e.Reason = strings.TrimSpace(event + ": " + p.Reason)
	e.Reason = strings.TrimSuffix(e.Reason, ":")
	e.Detail = `{"event":"` + event + `"}`
	t.seal(e)
	w := &writes{}
	w.statement(1, tenantSetDisabledSQL, t.id, at)
	w.entry(t, e)
	if err := levelsIn(ctx, tx, ts, t, now, p.LevelsFunc, w); err != nil {
		tx.abort()
		return rule.Snapshot{}, err
	}
	if err := tx.commit(ctx, w); err != nil {
		return rule.Snapshot{}, err
	}
	return t.snapshot(now), nil
}

// AdjustParams is an admin credit (positive) or debit (negative).
type AdjustParams struct {
	TenantID string
	Tokens   int64
	Reason   string
	Actor    string
}

// Adjust credits or debits a tenant's token balance by an admin's decision,
// with the reason in the ledger, under the tenant's lock (the rules:
// rule.CheckAdjustment and Bucket.Adjust). A credit is not capped at
// capacity; a debit may drive the balance negative, but not below the debt
// floor, minus one tokens capacity. It returns ErrBadAdjustment (no amount
// or no reason), an *OverflowError (ErrOverflow: the amount is beyond ±1e12
// tokens, or the balance would leave int64), ErrDebtFloor or
// ErrTenantNotFound; a refused adjustment changes nothing.
func (s *Store) Adjust(ctx context.Context, p AdjustParams) (rule.Snapshot, error) {
	reason, err := rule.CheckAdjustment(p.Tokens, p.Reason)
	if err != nil {
		return rule.Snapshot{}, err
	}
	tx, t, now, err := s.lockTenant(ctx, p.TenantID, nil, nil)
	if err != nil {
		return rule.Snapshot{}, err
	}
	t.advance(now)
	delta, err := t.Tokens.Adjust(p.Tokens)
	if err != nil {
		tx.abort()
		return rule.Snapshot{}, err
	}
	e := t.entry(ledger.KindAdjust, now, actorOr(p.Actor, "admin"))
	e.DeltaMicro = delta
	e.Reason = reason
	t.seal(e)
	w := &writes{}
	w.entry(t, e)
	if err := tx.commit(ctx, w); err != nil {
		return rule.Snapshot{}, err
	}
	return t.snapshot(now), nil
}

// TenantList returns every tenant's limits and balances, refilled to the
// database's clock now, without locking or writing.
func (s *Store) TenantList(ctx context.Context) ([]rule.Snapshot, error) {
	return s.snapshots(ctx, tenantListSQL)
}

// snapshots reads tenants with a query and refills them to the database's
// clock now.
func (s *Store) snapshots(ctx context.Context, query string, args ...any) ([]rule.Snapshot, error) {
	return readNow(ctx, s, "list tenants", query, args, func(r *tenantRow, now time.Time) rule.Snapshot {
		t := r.tenant()
		t.advance(now)
		return t.snapshot(now)
	})
}

// readNow reads rows of type R with a query, in the same round trip as the
// database's clock, and renders each as it stands at that instant: the
// one way every unlocked listing (tenants, model limits) sees balances.
func readNow[R, T any](ctx context.Context, s *Store, what, query string, args []any, render func(*R, time.Time) T) ([]T, error) {
	b := &pgx.Batch{}
	b.Queue(clockSQL, s.clock())
	b.Queue(query, args...)
	br := s.pool.SendBatch(ctx, b)
	defer br.Close()
	var now time.Time
	if err := br.QueryRow().Scan(&now); err != nil {
		return nil, fmt.Errorf("budget: clock: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("budget: %s: %w", what, err)
	}
	rs, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[R])
	if err != nil {
		return nil, fmt.Errorf("budget: %s: %w", what, err)
	}
	out := make([]T, len(rs))
	for i, r := range rs {
		out[i] = render(r, now)
	}
	return out, nil
}

// KeyEventParams is a key created or revoked, and the write that does it.
type KeyEventParams struct {
	TenantID string
	Event    string // "created" or "revoked"
	KeyID    string
	Actor    string
	// Detail is more of the entry's detail (a key's model scope, before
	// and after), beside its event and key id.
	Detail map[string]any
	// WriteFunc writes the key row (insert or revoke) on the transaction's
	// connection, under the tenant's lock; its error aborts everything.
	WriteFunc func(ctx context.Context, conn *pgxpool.Conn) error
}

// RecordKeyEvent makes a key change and appends its tenant entry in one
// transaction, so that who gave or took a tenant's access is in the
// tenant's ledger with everything else, and no key row exists or changes
// without its entry (nor the reverse), whatever crashes. It returns
// ErrTenantNotFound, or WriteFunc's error.
func (s *Store) RecordKeyEvent(ctx context.Context, p KeyEventParams) error {
	tx, t, now, err := s.lockTenant(ctx, p.TenantID, nil, nil)
	if err != nil {
		return err
	}
	if p.WriteFunc != nil {
		if err := p.WriteFunc(ctx, tx.conn); err != nil {
			tx.abort()
			return err
		}
	}
	t.advance(now)
	d := map[string]any{"event": "key_" + p.Event, "key_id": p.KeyID}
	for k, v := range p.Detail {
		d[k] = v
	}
	detail, err := json.Marshal(d)
	if err != nil {
		tx.abort()
		return err
	}
	e := t.entry(ledger.KindTenant, now, actorOr(p.Actor, "admin"))
	e.Reason = "key " + p.Event + ": " + p.KeyID
	e.Detail = string(detail)
	t.seal(e)
	w := &writes{}
	w.entry(t, e)
	return tx.commit(ctx, w)
}

// TreeNode is a tenant in its budget tree, with the tenants nested below it.
type TreeNode struct {
	Snapshot rule.Snapshot
	Children []*TreeNode
}

// TenantTree returns the whole budget tree that holds tenantID, from its
// root, every level refilled to the database's clock now (read without
// locks, like TenantList; only that tree's rows). It returns
// ErrTenantNotFound.
func (s *Store) TenantTree(ctx context.Context, tenantID string) (*TreeNode, error) {
	snaps, err := s.snapshots(ctx, tenantTreeSQL, tenantID)
	if err != nil {
		return nil, err
	}
	nodes := map[string]*TreeNode{}
	for _, snap := range snaps {
		nodes[snap.TenantID] = &TreeNode{Snapshot: snap}
	}
	n, ok := nodes[tenantID]
	if !ok {
		return nil, rule.ErrTenantNotFound
	}
	for _, snap := range snaps { // TenantList is in id order, so children are too
		if p := snap.Parent(); p != "" && nodes[p] != nil {
			nodes[p].Children = append(nodes[p].Children, nodes[snap.TenantID])
		}
	}
	if len(n.Snapshot.Path) > 0 {
		n = nodes[n.Snapshot.Path[0]]
	}
	return n, nil
}
