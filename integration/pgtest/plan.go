package pgtest

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var plans atomic.Int64

// GenericPlan is the plan Postgres runs for sql as the store runs it:
// prepared (pgx prepares every statement) in a transaction that setup
// begins with (the settings a decision or a journal group queues after its
// BEGIN), executed with args, a literal argument list ("ARRAY['a'], NULL").
// Plan tests read it for scans of tables that grow and for JIT.
func GenericPlan(ctx context.Context, t testing.TB, pool *pgxpool.Pool, setup func(*pgx.Batch), sql, args string) string {
	t.Helper()
	var plan string
	prepared(ctx, t, pool, setup, sql, func(tx pgx.Tx, name string) {
		plan = explain(ctx, t, tx, "EXPLAIN EXECUTE "+name+"("+args+")")
	})
	return plan
}

// AnalyzedPlan is GenericPlan's plan as it ran (EXPLAIN ANALYZE: each
// node's rows, and the rows its filters removed), and the statement's
// answer: the first column of each row it returned, space-separated. Plan
// tests read it for the work a statement does, where the plan's shape is
// the same for a statement that reads what it needs and one that reads
// everything and filters it.
func AnalyzedPlan(ctx context.Context, t testing.TB, pool *pgxpool.Pool, setup func(*pgx.Batch), sql, args string) (plan, answer string) {
	t.Helper()
	prepared(ctx, t, pool, setup, sql, func(tx pgx.Tx, name string) {
		// The answer first, in a savepoint rolled back, so that the
		// plan's run starts from the same rows.
		if _, err := tx.Exec(ctx, "SAVEPOINT answer"); err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, "EXECUTE "+name+"("+args+")")
		if err != nil {
			t.Fatalf("execute: %v", err)
		}
		var firsts []string
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				t.Fatal(err)
			}
			firsts = append(firsts, fmt.Sprint(vals[0]))
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("execute: %v", err)
		}
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT answer"); err != nil {
			t.Fatal(err)
		}
		answer = strings.Join(firsts, " ")
		plan = explain(ctx, t, tx, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) EXECUTE "+name+"("+args+")")
	})
	return plan, answer
}

// prepared runs use with sql prepared as name in a transaction that setup
// begins with, then rolls it back. A prepared statement outlives the
// transaction, on a pooled connection: each gets a name of its own and is
// deallocated.
func prepared(ctx context.Context, t testing.TB, pool *pgxpool.Pool, setup func(*pgx.Batch), sql string, use func(tx pgx.Tx, name string)) {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	b := &pgx.Batch{}
	setup(b)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	name := fmt.Sprintf("plan_%d", plans.Add(1))
	if _, err := tx.Exec(ctx, "PREPARE "+name+" AS "+sql); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	defer func() { _, _ = tx.Exec(ctx, "DEALLOCATE "+name) }()
	use(tx, name)
}

// explain is an EXPLAIN's lines, joined.
func explain(ctx context.Context, t testing.TB, tx pgx.Tx, q string) string {
	t.Helper()
	rows, err := tx.Query(ctx, q)
	if err != nil {
		t.Fatalf("explain: %v", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}
