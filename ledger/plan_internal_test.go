package ledger

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/integration/pgtest"
)

// planTx opens a transaction on a fresh test database, rolled back when
// the test ends, and runs stmts in it (settings, PREPAREs) before the
// EXPLAINs a plan test reads.
func planTx(t *testing.T, stmts ...string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pgtest.New(t, nil).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	return tx
}

// The dashboard counts recent entries of a kind on a table that only
// grows: the statement must be able to start from the created_at index.
// With sequential scans priced out, a plan that still scans the whole table
// has no other way (a volatile clock_timestamp() in the comparison did
// that).
func TestRecentKindCountsReadThroughAnIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tx := planTx(t, "SET LOCAL enable_seqscan = off")
	rows, err := tx.Query(ctx, "EXPLAIN "+kindCountsSQL, string(KindReserve), 60.0)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if plan := strings.Join(lines, "\n"); strings.Contains(plan, "Seq Scan on ledger_rows") {
		t.Fatalf("recent kind counts scan the whole ledger:\n%s", plan)
	}
}

// A verification's reads (the watch's on every replica, ledger verify's)
// start at the cursor and stop at the range's end down the primary key,
// whatever the statistics say (the primary key kept its name,
// ledger_entries_pkey, across 00038): a generic plan that read a tenant's whole
// chain, or every tenant's, on each page would make a run quadratic.
func TestEntryListReadsARangeOfThePrimaryKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tx := planTx(t, "SET LOCAL plan_cache_mode = force_generic_plan", "PREPARE list (text, bigint, bigint) AS "+entryListSQL,
		"PREPARE next_row (text, bigint) AS "+entryNextRowSQL, "PREPARE last_seq (text) AS "+entryLastSeqSQL)
	for q, cond := range map[string]string{
		"EXPLAIN EXECUTE list ('t', 100, 5100)": "(seq > $2) AND (seq <= $3)",
		"EXPLAIN EXECUTE next_row ('t', 100)":   "(seq > $2)",
		"EXPLAIN EXECUTE last_seq ('t')":        "Index Cond: (tenant_id = $1)",
	} {
		rows, err := tx.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		if !strings.Contains(plan, "using ledger_entries_pkey on ledger_rows") || !strings.Contains(plan, cond) ||
			strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Sort") {
			t.Fatalf("%s: not a range of the primary key (%s), unsorted:\n%s", q, cond, plan)
		}
	}
}
