package ledger

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tokengate/tokengate/integration/pgtest"
)

// The dashboard counts recent entries of a kind on a table that only
// grows: the statement must be able to start from the created_at index.
// With sequential scans priced out, a plan that still scans the whole table
// has no other way (a volatile clock_timestamp() in the comparison did
// that).
func TestRecentKindCountsReadThroughAnIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tx, err := pgtest.New(t, nil).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
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
