package account

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/integration/pgtest"
)

// The decision's reads and the sweeper's purges run on tables that grow
// without bound (admissions, idempotency keys, rejections) or that every
// decision locks (tenants): each must be able to use an index, whatever
// the table holds. A volatile function in a comparison (clock_timestamp()
// - interval) or an OR of two arrays leaves the planner nothing but a scan
// of the whole table, which is cheap on a test's empty table and ruinous
// on a production one. With sequential scans priced out, a statement that
// still plans one has no other way.
func TestGrowingTablesAreReadThroughAnIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	now := time.Now()
	ids, keys := []string{"a", "b"}, []string{"k1", "k2"}
	for _, c := range []struct {
		name, sql, table string
		args             []any
	}{
		{"tenant lock", tenantLockSQL, "tenants", []any{ids}},
		{"admission lock", admissionLockSQL, "admissions", []any{ids, ids, keys, &now}},
		{"admission lock's keys", admissionLockSQL, "idempotency_keys", []any{ids, ids, keys, &now}},
		{"idempotency read", idempotencyGetSQL, "idempotency_keys", []any{ids, keys, &now}},
		{"overdue reservations", admissionExpiredLockSQL, "admissions", []any{ids, 100, &now}},
		{"idempotency purge", idempotencyPurgeSQL, "idempotency_keys", []any{1000}},
		{"deferred settles purge", deferredSettlePurgeSQL, "deferred_settles", []any{1000}},
		{"rejections purge", rejectionsPurgeSQL, "rejection_counts", nil},
		{"rejections read", rejectionsSinceSQL, "rejection_counts", []any{60}},
	} {
		plan := explain(ctx, t, pool, c.sql, c.args...)
		if strings.Contains(plan, "Seq Scan on "+c.table) {
			t.Errorf("%s scans all of %s:\n%s", c.name, c.table, plan)
		}
	}
}

type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// explain is the plan Postgres makes for sql with args, sequential scans
// disabled (still chosen when nothing else can answer).
func explain(ctx context.Context, t *testing.T, db beginner, sql string, args ...any) string {
	t.Helper()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
	if err != nil {
		t.Fatalf("explain %s: %v", sql, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}
