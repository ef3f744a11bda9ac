package account

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tokengate/tokengate/budget/rule"
	"github.com/tokengate/tokengate/ledger"
)

// LockedQuerier is the transaction a LockedFunc runs its own statements
// in: the one that holds the tenant's row lock.
type LockedQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// LockedEntry is a ledger entry a use case beside the store (budget/batch)
// appends to a tenant's chain. It moves no balance of the store's: its
// refill and delta are zero, and its balances those the row holds.
type LockedEntry struct {
	Kind ledger.Kind
	// Ref is the entry's admission_id: what the entry is about (a batch's
	// id), so that an auditor follows one story by it.
	Ref              string
	Model            string
	Estimate, Actual *int64
	Actor, Reason    string
	Detail           string // JSON
	// MoneyMicro is the entry's money, as an admission's entries carry
	// theirs: a reserve's estimate, a settle's actual - estimate, a
	// refund's -estimate (nil: no money).
	MoneyMicro *int64
	// Money, when set, is counted in the money windows of the tenant and
	// its ancestors (LockedMoney); each ancestor gets an entry of the same
	// kind, ref and money in its own chain, as an admission's levels do.
	Money *LockedMoney
}

// LockedFunc is a change decided under a tenant's row lock, at now (the
// database's clock, or the store's frozen one). Its statements run in q;
// the entries it returns are appended to the tenant's chain in the same
// transaction. An error rolls everything back.
type LockedFunc func(ctx context.Context, q LockedQuerier, now time.Time) ([]LockedEntry, error)

// Locked runs fn in a transaction that holds tenantID's row lock (and its
// ancestors', in the one lock order), so that tables a use case beside the
// store owns (a batch allowance) change in the same serial order as the
// tenant's balances, whatever the replica, with their ledger entries in
// the same transaction. It returns fn's error or rule.ErrTenantNotFound.
func (s *Store) Locked(ctx context.Context, tenantID string, fn LockedFunc) error {
	return s.locked(ctx, tenantID, "", false, fn)
}

// LockedAdmit is Locked for a change a tenant's key asks for (a batch's
// reserve): like an admission, it is refused in the same transaction if
// the tenant is disabled (rule.ErrTenantDisabled) or the key revoked or
// not the tenant's (rule.ErrKeyRevoked), so that a revocation applies in
// every replica at once.
func (s *Store) LockedAdmit(ctx context.Context, tenantID, keyID string, fn LockedFunc) error {
	return s.locked(ctx, tenantID, keyID, true, fn)
}

func (s *Store) locked(ctx context.Context, tenantID, keyID string, admit bool, fn LockedFunc) error {
	live := false
	var extra func(*pgx.Batch)
	var readExtra func(pgx.BatchResults) error
	if admit {
		extra = func(b *pgx.Batch) { b.Queue(keyLiveSQL, []string{keyID}) }
		readExtra = func(br pgx.BatchResults) error {
			rows, err := br.Query()
			if err != nil {
				return fmt.Errorf("budget: key: %w", err)
			}
			defer rows.Close()
			for rows.Next() {
				var id, tenant string
				var priority *string
				var models []string
				if err := rows.Scan(&id, &tenant, &priority, &models); err != nil {
					return fmt.Errorf("budget: key: %w", err)
				}
				live = live || tenant == tenantID
			}
			return rows.Err()
		}
	}
	tx, ts, now, err := s.lockTenants(ctx, []string{tenantID}, extra, readExtra)
	if err != nil {
		return err
	}
	t, ok := ts[tenantID]
	if !ok {
		tx.abort()
		return rule.ErrTenantNotFound
	}
	switch {
	case admit && t.disabled:
		tx.abort()
		return rule.ErrTenantDisabled
	case admit && !live:
		tx.abort()
		return rule.ErrKeyRevoked
	}
	entries, err := fn(ctx, tx.conn, now)
	if err != nil {
		tx.abort()
		return err
	}
	if len(entries) == 0 {
		if _, err := tx.conn.Exec(ctx, "COMMIT"); err != nil {
			tx.abort()
			return fmt.Errorf("budget: commit: %w", err)
		}
		tx.open = false
		tx.abort()
		return nil
	}
	w := &writes{}
	chain := make([]*tenant, 0, len(t.path)+1)
	for _, id := range t.path {
		if a, ok := ts[id]; ok {
			chain = append(chain, a)
		}
	}
	chain = append(chain, t)
	for _, le := range entries {
		levels := []*tenant{t}
		if le.Money != nil {
			if err := applyMoney(chain, *le.Money, now); err != nil {
				tx.abort()
				return err
			}
			levels = chain
		}
		for _, lv := range levels {
			e := lv.entry(le.Kind, now, le.Actor)
			e.AdmissionID, e.Model, e.Estimate, e.Actual = le.Ref, le.Model, le.Estimate, le.Actual
			e.Reason, e.Detail, e.MoneyMicro = le.Reason, le.Detail, le.MoneyMicro
			lv.seal(e)
			w.entry(lv, e)
		}
	}
	return tx.commit(ctx, w)
}

// Now is the time the store decides at: the database's clock, or the
// frozen one of WithClock.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := s.pool.QueryRow(ctx, clockSQL, s.clock()).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("budget: clock: %w", err)
	}
	return now, nil
}
