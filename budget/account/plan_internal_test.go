package account

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
		{"forgotten keys", idempotencyForgetSQL, "idempotency_keys", []any{ids, keys, &now}},
		{"overdue reservations", admissionExpiredLockSQL, "admissions", []any{ids, 100, &now}},
		{"idempotency purge", idempotencyPurgeSQL, "idempotency_keys", []any{1000}},
		// A range of created_at over every tenant: a block range index
		// (00034; TestDriftReportReadsTimeThroughBRIN).
		{"drift report, every tenant", driftReportSQL, "admissions", []any{"", "", now.Add(-time.Hour), now}},
		{"drift report by model", driftReportByModelSQL, "admissions", []any{"", "", now.Add(-time.Hour), now}},
		{"drift report's group rows", driftReportSQL, "lease_groups", []any{"", "", now.Add(-time.Hour), now}},
		{"drift report by model's group rows", driftReportByModelSQL, "lease_groups", []any{"", "", now.Add(-time.Hour), now}},
		{"latest admissions' group rows", admissionRecentSQL, "lease_groups", []any{"t", 50}},
		{"an admission's group row", admissionGetSQL, "lease_groups", []any{"adm_06dqdpn801at9ckscy00000c00", "t"}},
		{"an admission's lease", admissionLeaseSQL, "lease_groups", []any{"adm_06dqdpn801at9ckscy00000c00"}},
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
	return planOf(ctx, t, tx, "EXPLAIN "+sql, args...)
}

// planOf runs an EXPLAIN and returns its plan, a line a node.
func planOf(ctx context.Context, t *testing.T, tx pgx.Tx, explain string, args ...any) string {
	t.Helper()
	rows, err := tx.Query(ctx, explain, args...)
	if err != nil {
		t.Fatalf("%s: %v", explain, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// The drift report over every tenant reads a range of created_at alone,
// through a block range index (00034: a B-tree there cost every admission
// an entry), on a table written in time order as the store writes it.
func TestDriftReportReadsTimeThroughBRIN(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	for _, q := range []string{
		`INSERT INTO tenants (id, tokens_capacity, tokens_rate_micro, tokens_micro) VALUES ('t', 1000, 1, 0), ('u', 1000, 1, 0)`,
		`INSERT INTO admissions (id, tenant_id, state, model, input_tokens, output_tokens, cost, approximate,
			input_weight_micro, output_weight_micro, created_at, expires_at)
		 SELECT 'a' || i, CASE WHEN i % 2 = 0 THEN 't' ELSE 'u' END, 'settled', 'gpt-4o', 1, 1, 2, false, 1, 1,
		        timestamptz '2026-01-01' + i * interval '1 minute', timestamptz '2026-01-01' + i * interval '1 minute'
		 FROM generate_series(1, 60000) AS i`,
		`ANALYZE admissions`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	from := time.Date(2026, 1, 20, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct{ name, sql string }{
		{"drift report, every tenant", driftReportSQL},
		{"drift report by model", driftReportByModelSQL},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		plan := planOf(ctx, t, tx, "EXPLAIN "+c.sql, "", "", from, from.Add(24*time.Hour))
		_ = tx.Rollback(ctx)
		if !strings.Contains(plan, "Bitmap Index Scan on admissions_created_brin") {
			t.Errorf("%s of one day in 41 does not read admissions_created_brin:\n%s", c.name, plan)
		}
	}
}

// A decision's transaction and a lease journal group run their statements
// on generic plans (plan_cache_mode = force_generic_plan: planning them on
// every use cost more than the statements), and a generic plan knows
// nothing of its arguments: a range open on one side is costed as a third
// of the table, and one lease, renewed for hours, names most of a hot
// tenant's admissions. Each statement that reads the tables that grow
// (tenants, with their end users; admissions; idempotency keys) must stay
// an index read as a generic plan on such tables, sequential scans
// allowed and the statistics current.
func TestGenericPlansStayIndexed(t *testing.T) {
	t.Parallel()
	// Both ends of the tenants table: a large one (end users are tenants),
	// and a small one, which a generic plan scanned whole in every
	// decision and journal group before the transactions priced scans out
	// (QueueGenericPlans): 65 tenants, as the benches run.
	// And both ends of the share of admissions still open: all of them
	// (an admit-only load nobody settles), or one in 4,000 (settled as
	// they come): a plan made on either must stay an index read
	// (TestJournalEndsReadByID found one that did not).
	for _, c := range []struct {
		tenants int
		open    string
	}{{20000, "all open"}, {64, "all open"}, {64, "few open"}} {
		t.Run(fmt.Sprintf("%d tenants, %s", c.tenants+1, c.open), func(t *testing.T) {
			t.Parallel()
			genericPlansStayIndexed(t, c.tenants, c.open == "few open")
		})
	}
}

func genericPlansStayIndexed(t *testing.T, tenants int, fewOpen bool) {
	state := `'reserved'`
	if fewOpen {
		state = `CASE WHEN i % 4000 = 0 THEN 'reserved' ELSE 'settled' END`
	}
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	seedLeaseAdmissions(ctx, t, pool, state,
		`INSERT INTO idempotency_keys (tenant_id, key, admission_id, request_hash, response, created_at)
		 SELECT 't', 'k' || i, 'a' || i, '\x00', '\x00', now() FROM generate_series(1, 20000) AS i`,
		`INSERT INTO admission_lease_books (lease_id, booked_seq) VALUES ('L', 19990)`,
		// A groups-shape journal's rows (00039): 20,000 groups of one
		// replica, each of the lease 'G' and another, the last few not
		// booked, and their state rows, few of them open.
		`INSERT INTO leases (id, tenant_id, holder, state, levels, slice_micro, taken_at, renewed_at, expires_at)
		 VALUES ('G', 't', 'r', 'live', ARRAY['t'], 1, now(), now(), now() + interval '1 hour')`,
		`INSERT INTO lease_groups (seq, replica, holder, count, created_at, ids, tenant_ids, lease_ids, models, input, output, cost,
		     approximate, input_weight, output_weight, expires_at, families, price_models, price_from, money_estimate, faces, price_tiers, actors)
		 SELECT i, 'r', 7, i, now(), ARRAY['g' || i, 'h' || i], ARRAY['t', 't'], ARRAY['G', 'H'], ARRAY['m', 'm'], ARRAY[1, 1], ARRAY[1, 1],
		        ARRAY[2, 2], ARRAY[false, false], ARRAY[1, 1], ARRAY[1, 1], ARRAY[now() + interval '1 hour', now() + interval '1 hour'],
		        ARRAY['', ''], ARRAY['', ''], ARRAY[NULL, NULL]::timestamptz[], ARRAY[NULL, NULL]::bigint[], ARRAY['api', 'api'], ARRAY['', ''], ARRAY['', '']
		 FROM generate_series(1, 20000) AS i`,
		`INSERT INTO lease_group_states (seq, open_until)
		 SELECT i, CASE WHEN i % 4000 = 0 THEN now() + interval '1 hour' END FROM generate_series(1, 20000) AS i`,
		`INSERT INTO admission_lease_books (lease_id, booked_seq) VALUES ('G', 19990 * 2048)`,
		fmt.Sprintf(`INSERT INTO tenants (id, tokens_capacity, tokens_rate_micro, tokens_micro)
		 SELECT 'u' || i, 1000, 1, 0 FROM generate_series(1, %d) AS i`, tenants),
		`ANALYZE tenants, admissions, idempotency_keys, admission_lease_books, leases, lease_groups, lease_group_states`)
	nulls := func(n int) string { return strings.TrimSuffix(strings.Repeat("NULL, ", n), ", ") }
	for _, c := range []struct {
		name, sql, args string
	}{
		{"lease pending", admissionLeasePendingSQL, `'L'`},
		{"lease booking", admissionLeaseBookSQL, `'L', NULL, NULL, NULL`},
		{"lease pending, groups", admissionLeasePendingSQL, `'G'`},
		{"lease booking, groups", admissionLeaseBookSQL, `'G', NULL, NULL, NULL`},
		{"lease booking, recorded groups", admissionLeaseBookSQL, `'G', NULL, ARRAY[7, 7], ARRAY[19995, 19996]`},
		{"journal's group", admissionInsertGroupSQL, `'r', 7, 20001, NULL, ` + nulls(22) + `, ARRAY['g19995'], ARRAY['G'], ARRAY[1], ARRAY[0], ARRAY[1],
			ARRAY[NULL]::bigint[], ARRAY[1], ARRAY[7], ARRAY[19995], true`},
		{"settle's booking", admissionLeaseBookNamedSQL, `ARRAY['a19995'], ARRAY['t'], ARRAY['k19996'], NULL`},
		{"admission lock", admissionLockSQL, `ARRAY['a19995'], ARRAY['t'], ARRAY['k19996'], NULL`},
		{"idempotency read", idempotencyGetSQL, `ARRAY['t'], ARRAY['k19996'], NULL`},
		{"key locks", idempotencyKeyLockSQL, `ARRAY['t'], ARRAY['k19996'], true`},
		{"tenant lock", tenantLockSQL, `ARRAY['t']`},
		{"tenants' update", tenantUpdateSQL, nulls(9)},
		{"journal's insert", admissionInsertLeasedSQL, nulls(23)},
		{"forgotten keys", idempotencyForgetSQL, `ARRAY['t'], ARRAY['k19996'], NULL`},
		{"journal's ends", admissionEndLeasedSQL, `ARRAY['a19995'], ARRAY['L'], ARRAY[1], ARRAY[0], ARRAY[1], ARRAY[NULL]::bigint[], ARRAY[1], NULL, true`},
		{"admissions' end", admissionEndSQL, nulls(10)},
		{"model limits lock", modelLimitsLockSQL, `ARRAY['t']`},
		{"model scopes", modelScopesSQL, `'t', ''`},
		{"overdue reservations", admissionExpiredLockSQL, `ARRAY['t'], 100, NULL`},
		{"clock and price book", clockPricesSQL, `NULL`},
	} {
		plan := pgtest.GenericPlan(ctx, t, pool, QueueGenericPlans, c.sql, c.args)
		// A booking reads a lease's ends above its cursor down their own
		// index, bounded by the cursor: every end of a long-lived lease
		// is in that index, and all but the last few are booked.
		if strings.Contains(c.name, "booking") && (!strings.Contains(plan, "Index Scan using admissions_lease_end_idx") || !strings.Contains(plan, "(lease_end_seq > ")) {
			t.Errorf("%s reads the lease's ends other than down admissions_lease_end_idx from its cursor:\n%s", c.name, plan)
		}
		// A scan priced out (price_book_version is one row) costs more
		// than JIT's threshold: compiled on every execution, 120 ms.
		if strings.Contains(plan, "JIT") {
			t.Errorf("%s, as a generic plan, is compiled (JIT):\n%s", c.name, plan)
		}
		// The groups' reads: a booking's bounded by its cursor (down
		// lease_groups_replica_idx, or the primary key with one replica
		// in the table), an end's down lease_groups_group_idx.
		if strings.Contains(c.name, "groups") && !strings.Contains(plan, "(seq >= (") {
			t.Errorf("%s reads the holder's groups other than from its cursor:\n%s", c.name, plan)
		}
		if strings.Contains(c.name, "group") && strings.Contains(c.sql, "lease_group_states") && !strings.Contains(plan, "lease_groups_group_idx") {
			t.Errorf("%s finds the ends' groups other than down lease_groups_group_idx:\n%s", c.name, plan)
		}
		for _, table := range []string{"tenants", "admissions", "idempotency_keys", "lease_groups", "lease_group_states", "leases"} {
			if strings.Contains(plan, "Seq Scan on "+table) {
				t.Errorf("%s, as a generic plan, scans all of %s:\n%s", c.name, table, plan)
			}
		}
		// An index read of a range the planner thinks holds a third of
		// the table is one it may trade for a scan of it as the table
		// grows (it did, in the bench): a read of admissions is costed
		// at a fifth of its rows at most, or stopped by a Limit above it.
		lines := strings.Split(plan, "\n")
		for i, l := range lines {
			if !strings.Contains(l, " on admissions ") || !strings.Contains(l, "rows=") {
				continue
			}
			var rows int
			if _, err := fmt.Sscanf(l[strings.Index(l, "rows=")+len("rows="):], "%d", &rows); err != nil {
				t.Fatalf("%s: no estimate in %q", c.name, l)
			}
			if rows > 4000 && !strings.Contains(parentOf(lines, i), "Limit") {
				t.Errorf("%s, as a generic plan, reads %d of admissions' 20000 rows:\n%s", c.name, rows, plan)
			}
		}
	}
}

// parentOf is the node above line i of an EXPLAIN: the nearest line
// before it whose node ("->") is indented less.
func parentOf(lines []string, i int) string {
	depth := strings.Index(lines[i], "->")
	for j := i - 1; j >= 0; j-- {
		if d := strings.Index(lines[j], "->"); d >= 0 && d < depth {
			return lines[j]
		}
	}
	return lines[0]
}

// A journal group's ends name their admissions by id, and the admissions
// that are still reserved are a share of the table that moves with the
// load: a few after settles, most after a spell of admissions nobody
// settles (the rate limit service's admit-only traffic). A generic plan
// made while the statistics said "few reserved" read the ends through
// admissions_open_expiry_idx, every open reservation, and hashed them
// against the ids: on a host Postgres, after eight seconds of admit-only
// load left 50,000 open, each group's ends took 9 ms and a replica's
// settles fell twentyfold (bench-peer, 2026-12-07). The ends are read
// by their ids, whatever share is reserved.
func TestJournalEndsReadByID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	seedLeaseAdmissions(ctx, t, pool, `CASE WHEN i % 4000 = 0 THEN 'reserved' ELSE 'settled' END`, `ANALYZE admissions`)
	plan := pgtest.GenericPlan(ctx, t, pool, QueueGenericPlans, admissionEndLeasedSQL,
		`ARRAY['a4000'], ARRAY['L'], ARRAY[1], ARRAY[0], ARRAY[1], ARRAY[NULL]::bigint[], ARRAY[1], NULL, true`)
	if strings.Contains(plan, "admissions_open_expiry_idx") || !strings.Contains(plan, "admissions_pkey") {
		t.Errorf("the journal's ends are not read by their ids (admissions_pkey) alone:\n%s", plan)
	}
}

// seedLeaseAdmissions writes tenant t and 20,000 admissions of its lease L
// (a1 to a20000, lease_seq i), each in state (an SQL expression of i),
// then runs more.
func seedLeaseAdmissions(ctx context.Context, t *testing.T, pool *pgxpool.Pool, state string, more ...string) {
	t.Helper()
	for _, q := range append([]string{
		`INSERT INTO tenants (id, tokens_capacity, tokens_rate_micro, tokens_micro) VALUES ('t', 1000, 1, 0)`,
		`INSERT INTO admissions (id, tenant_id, state, model, input_tokens, output_tokens, cost, approximate,
			input_weight_micro, output_weight_micro, created_at, expires_at, lease_id, lease_seq)
		 SELECT 'a' || i, 't', ` + state + `, 'gpt-4o', 1, 1, 2, false, 1, 1, now(), now() + interval '1 hour', 'L', i
		 FROM generate_series(1, 20000) AS i`,
	}, more...) {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// The group rows' statements (00039) look their groups and state rows up
// one by one, whatever the tables held when the plan was made: a generic
// plan of the journal's group made while lease_groups was small (the
// bench's warm-up) joined the ends with a hash of the whole table, and
// kept doing so as it grew (2.7 ms a group; the sweeper's copy of overdue
// admissions took 1.3 s). Planned here on 50 groups, each must read them
// down an index.
func TestGroupStatementsLookUpOneByOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	for _, q := range []string{
		`INSERT INTO tenants (id, tokens_capacity, tokens_rate_micro, tokens_micro) VALUES ('t', 1000, 1, 0)`,
		`INSERT INTO leases (id, tenant_id, holder, state, levels, slice_micro, taken_at, renewed_at, expires_at)
		 VALUES ('G', 't', 'r', 'live', ARRAY['t'], 1, now(), now(), now() + interval '1 hour')`,
		`INSERT INTO lease_groups (seq, replica, holder, count, created_at, ids, tenant_ids, lease_ids, models, input, output, cost,
		     approximate, input_weight, output_weight, expires_at, families, price_models, price_from, money_estimate, faces, price_tiers, actors)
		 SELECT i, 'r', 7, i, now(), ARRAY['g' || i], ARRAY['t'], ARRAY['G'], ARRAY['m'], ARRAY[1], ARRAY[1], ARRAY[2], ARRAY[false],
		        ARRAY[1], ARRAY[1], ARRAY[now() - interval '1 hour'], ARRAY[''], ARRAY[''], ARRAY[NULL]::timestamptz[], ARRAY[NULL]::bigint[],
		        ARRAY['api'], ARRAY[''], ARRAY['']
		 FROM generate_series(1, 50) AS i`,
		`INSERT INTO lease_group_states (seq, open_until) SELECT i, now() - interval '1 hour' FROM generate_series(1, 50) AS i`,
		`ANALYZE tenants, leases, lease_groups, lease_group_states, admissions`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	nulls := func(n int) string { return strings.TrimSuffix(strings.Repeat("NULL, ", n), ", ") }
	id := `'adm_06dqdpn801at9ckscy00000c00'`
	for _, c := range []struct{ name, sql, args string }{
		{"journal's group", admissionInsertGroupSQL, `'r', 7, 51, NULL, ` + nulls(22) + `, ARRAY['g9'], ARRAY['G'], ARRAY[1], ARRAY[0], ARRAY[1],
			ARRAY[NULL]::bigint[], ARRAY[1], ARRAY[7], ARRAY[9], true`},
		{"overdue copy", admissionMaterializeOverdueSQL, `100, NULL`},
		{"group lock", admissionGroupLockSQL, `ARRAY[` + id + `], ARRAY['t'], ARRAY['k'], NULL`},
		{"copy", admissionMaterializeSQL, `ARRAY[` + id + `], ARRAY['t'], ARRAY['k'], NULL, ARRAY['t']`},
		{"read", admissionGetSQL, id + `, 't'`},
		{"lease", admissionLeaseSQL, id},
	} {
		plan := pgtest.GenericPlan(ctx, t, pool, QueueGenericPlans, c.sql, c.args)
		for _, bad := range []string{"Seq Scan on lease_groups", "Seq Scan on lease_group_states", "Hash Join", "Hash Right Join", "Merge Join"} {
			if strings.Contains(plan, bad) {
				t.Errorf("%s, as a generic plan made on 50 groups, has a %s:\n%s", c.name, bad, plan)
			}
		}
	}
}

// A lease's booking of a groups-shape journal (00039) reads its group rows
// at the places its lease holds (array_positions), not row by row through
// every admission and end of the group: an unnest of the arrays made a row
// of each of the group's admissions, the other leases' too, and filtered
// them out; at 64 tenants each lease's booking read every group it was in
// whole, 83 us a 64-admission row against 7 (BENCHMARKS.md, "Quota
// leasing, fifteenth step"). One group of 64 leases' admissions and ends
// here: each booking returns its lease's two events, and no scan of an
// array filters out another lease's.
func TestGroupBookingsReadTheirPlaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	for _, q := range []string{
		`INSERT INTO tenants (id, tokens_capacity, tokens_rate_micro, tokens_micro) SELECT 't' || i, 1000, 1, 0 FROM generate_series(1, 64) AS i`,
		`INSERT INTO leases (id, tenant_id, holder, state, levels, slice_micro, taken_at, renewed_at, expires_at)
		 SELECT 'L' || i, 't' || i, 'r', 'live', ARRAY['t' || i], 1, now(), now(), now() + interval '1 hour' FROM generate_series(1, 64) AS i`,
		// Group 1 holds an admission of each lease; group 2 one more of
		// each and the end of each of group 1's.
		`INSERT INTO lease_groups (seq, replica, holder, count, created_at, ids, tenant_ids, lease_ids, models, input, output, cost,
		     approximate, input_weight, output_weight, expires_at, families, price_models, price_from, money_estimate, faces, price_tiers, actors,
		     end_ids, end_leases, end_input, end_output, end_cost, end_money, end_refund, end_models, end_estimates, end_money_estimates, end_actors)
		 SELECT g, 'r', 7, g, now(), array_agg('g' || g || '-' || i ORDER BY i), array_agg('t' || i ORDER BY i), array_agg('L' || i ORDER BY i),
		        array_agg('m'::text), array_agg(1::bigint), array_agg(1::bigint), array_agg(i::bigint), array_agg(false), array_agg(1::bigint),
		        array_agg(1::bigint), array_agg(now() + interval '1 hour'), array_agg(''::text), array_agg(''::text),
		        array_agg(NULL::timestamptz), array_agg(NULL::bigint), array_agg('api'::text), array_agg(''::text), array_agg(''::text),
		        CASE g WHEN 2 THEN array_agg('g1-' || i ORDER BY i) END, CASE g WHEN 2 THEN array_agg('L' || i ORDER BY i) END,
		        CASE g WHEN 2 THEN array_agg(1::bigint) END, CASE g WHEN 2 THEN array_agg(0::bigint) END,
		        CASE g WHEN 2 THEN array_agg(1::bigint) END, CASE g WHEN 2 THEN array_agg(NULL::bigint) END,
		        CASE g WHEN 2 THEN array_agg((i - 1)::bigint) END, CASE g WHEN 2 THEN array_agg('m'::text) END,
		        CASE g WHEN 2 THEN array_agg(i::bigint) END, CASE g WHEN 2 THEN array_agg(NULL::bigint) END,
		        CASE g WHEN 2 THEN array_agg(''::text) END
		 FROM generate_series(1, 2) AS g CROSS JOIN generate_series(1, 64) AS i GROUP BY g`,
		`INSERT INTO lease_group_states (seq, open_until) SELECT i, now() + interval '1 hour' FROM generate_series(1, 2) AS i`,
		`ANALYZE tenants, leases, lease_groups, lease_group_states, admissions`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, c := range []struct{ name, sql, args, want string }{
		{"booking by its journal's groups", admissionLeaseBookSQL, `'L7', NULL, ARRAY[7, 7], ARRAY[1, 2]`, "g1-7 g2-7 g1-7"},
		{"booking by a scan of its holder's groups", admissionLeaseBookSQL, `'L9', NULL, NULL, NULL`, "g1-9 g2-9 g1-9"},
		{"pending check", admissionLeasePendingSQL, `'L11'`, "true"},
	} {
		plan, got := pgtest.AnalyzedPlan(ctx, t, pool, QueueGenericPlans, c.sql, c.args)
		if got != c.want {
			t.Errorf("%s answered %q, want %q", c.name, got, c.want)
		}
		inArrays := false // below a scan of an array's places
		for _, line := range strings.Split(plan, "\n") {
			if strings.Contains(line, "->") {
				inArrays = strings.Contains(line, "Function Scan")
			}
			if inArrays && strings.Contains(line, "Rows Removed by Filter") {
				t.Errorf("%s reads through its group rows' arrays, filtering other leases' places out (%s):\n%s", c.name, strings.TrimSpace(line), plan)
			}
		}
	}
}
