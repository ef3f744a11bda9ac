package migrations_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/tokengate/tokengate/integration/pgtest"
	"github.com/tokengate/tokengate/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// migratorAt returns an empty database migrated up to version, and its
// migrator: the schema of an older release, for upgrade tests to fill as
// that release wrote it.
func migratorAt(t *testing.T, version int64) (*pgxpool.Pool, *migrations.Migrator) {
	t.Helper()
	pool := pgtest.Pool(t, pgtest.EmptyURL(t), nil)
	m, err := migrations.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	if err := m.UpTo(context.Background(), version); err != nil {
		t.Fatal(err)
	}
	return pool, m
}

func TestUpFromEmptyThenRerunChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.EmptyURL(t), nil)

	m, err := migrations.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })

	if err := m.Check(ctx); !errors.Is(err, migrations.ErrPending) {
		t.Fatalf("Check on an empty database = %v, want ErrPending", err)
	}
	applied, err := m.Up(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, target, err := m.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) == 0 || applied[len(applied)-1] != target {
		t.Fatalf("first Up applied %v, want every version up to %d", applied, target)
	}
	if err := m.Check(ctx); err != nil {
		t.Fatalf("Check after Up = %v, want nil", err)
	}

	schema := func() string {
		var s string
		err := pool.QueryRow(ctx, `
			SELECT string_agg(table_name || '.' || column_name || ':' || data_type, ',' ORDER BY table_name, ordinal_position)
			FROM information_schema.columns WHERE table_schema = 'public'`).Scan(&s)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := schema()
	var rowsBefore int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM goose_db_version`).Scan(&rowsBefore); err != nil {
		t.Fatal(err)
	}

	again, err := m.Up(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 0 {
		t.Fatalf("second Up applied %v, want nothing", again)
	}
	var rowsAfter int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM goose_db_version`).Scan(&rowsAfter); err != nil {
		t.Fatal(err)
	}
	if after := schema(); after != before || rowsAfter != rowsBefore {
		t.Fatalf("second Up changed the database:\nschema before %s\nschema after  %s\nversion rows %d -> %d", before, after, rowsBefore, rowsAfter)
	}
	for _, table := range []string{"tenants", "api_keys"} {
		var exists bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil || !exists {
			t.Fatalf("table %s missing after Up (err %v)", table, err)
		}
	}
}

func TestConcurrentUpAppliesEachVersionOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.EmptyURL(t), nil)

	const replicas = 4
	errs := make(chan error, replicas)
	applied := make(chan int, replicas)
	for range replicas {
		go func() {
			m, err := migrations.New(pool, nil)
			if err != nil {
				applied <- 0
				errs <- err
				return
			}
			defer m.Close()
			versions, err := m.Up(ctx)
			applied <- len(versions)
			errs <- err
		}()
	}
	total := 0
	for range replicas {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for range replicas {
		total += <-applied
	}
	m, err := migrations.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	_, target, err := m.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var files int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM goose_db_version WHERE version_id > 0`).Scan(&files); err != nil {
		t.Fatal(err)
	}
	if total != files || int64(files) == 0 || target == 0 {
		t.Fatalf("4 concurrent Up calls applied %d migrations in total; %d are recorded; want each applied exactly once", total, files)
	}
}

// The tables every admission inserts into carry no foreign key (each costs
// every row a trigger's query; the decision holds the references itself,
// see 00013), and tenants keep room in their pages for the decision's
// updates to stay HOT.
func TestHotPathTablesCarryNoPerRowChecks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	var fks []string
	rows, err := pool.Query(ctx, `
		SELECT conname FROM pg_constraint
		WHERE contype = 'f' AND conrelid IN ('admissions'::regclass, 'idempotency_keys'::regclass, 'ledger_rows'::regclass)`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		fks = append(fks, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(fks) > 0 {
		t.Errorf("foreign keys on the hot path's tables: %v", fks)
	}
	var opts []string
	if err := pool.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = 'tenants'::regclass`).Scan(&opts); err != nil {
		t.Fatal(err)
	}
	if len(opts) != 1 || opts[0] != "fillfactor=20" {
		t.Errorf("tenants' options = %v, want [fillfactor=20]", opts)
	}
}

// A tenant's place in the tree never changes, whatever statement tries;
// the guard's condition is the trigger's WHEN, so an update of the balances
// (every decision's) does not call it.
func TestATenantsPlaceInTheTreeNeverChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	if _, err := pool.Exec(ctx, `
		INSERT INTO tenants (id, tokens_capacity, tokens_rate_micro, reservation_ttl_ms, tokens_micro, tokens_at, requests_micro, requests_at, created_at, path, depth, parent_id)
		VALUES ('org', 10, 1, 1000, 10, now(), 0, now(), now(), '{}', 0, NULL),
		       ('team', 10, 1, 1000, 10, now(), 0, now(), now(), '{org}', 1, 'org'),
		       ('other', 10, 1, 1000, 10, now(), 0, now(), now(), '{}', 0, NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE tenants SET tokens_micro = 5, ledger_seq = ledger_seq + 1 WHERE id = 'team'`); err != nil {
		t.Fatalf("updating a balance: %v", err)
	}
	for _, stmt := range []string{
		`UPDATE tenants SET parent_id = 'other', path = '{other}' WHERE id = 'team'`,
		`UPDATE tenants SET path = '{other}' WHERE id = 'team'`,
		`UPDATE tenants SET parent_id = NULL, path = '{}', depth = 0 WHERE id = 'team'`,
		`UPDATE tenants SET parent_id = 'org', path = '{org}', depth = 1 WHERE id = 'other'`,
	} {
		_, err := pool.Exec(ctx, stmt)
		if err == nil || !strings.Contains(err.Error(), "never changes") {
			t.Errorf("%s: err = %v, want the tree's guard", stmt, err)
		}
	}
}

// 00033 moves leased admissions from the old journal to the admissions
// table, and neither release can book the other's: the migration refuses
// to run while a lease is live or a journal row is unbooked, names the way
// out (lease mode off), and applies once leasing is off.
func TestLeaseMigrationNeedsLeasingOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, m := migratorAt(t, 32)
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, tokens_capacity, tokens_rate_micro, tokens_micro, tokens_at, created_at)
		VALUES ('acme', 1000, 1, 0, now(), now())`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO leases (id, tenant_id, holder, state, levels, slice_micro, taken_at, renewed_at, expires_at)
		VALUES ('l1', 'acme', 'r1', 'live', '{acme}', 10, now(), now(), now() + interval '10 seconds')`); err != nil {
		t.Fatal(err)
	}
	if err := m.UpTo(ctx, 33); err == nil || !strings.Contains(err.Error(), "lease mode off") {
		t.Fatalf("migrate with a live lease: %v; want a refusal naming lease mode off", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE leases SET state = 'returned', ended_at = now()`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO lease_admissions (lease_id, admission_id, model, cost, cost_micro, created_at)
		VALUES ('l1', 'a1', 'gpt-4o', 1, 1000000, now())`); err != nil {
		t.Fatal(err)
	}
	if err := m.UpTo(ctx, 33); err == nil || !strings.Contains(err.Error(), "lease mode off") {
		t.Fatalf("migrate with an unbooked journal row: %v; want a refusal", err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM lease_admissions`); err != nil {
		t.Fatal(err)
	}
	if err := m.UpTo(ctx, 33); err != nil {
		t.Fatalf("migrate with leasing off: %v", err)
	}
}

// 00037 comes with the release whose journal ends admissions, which the
// booking of a release before 00036 would skip: the migration refuses to
// run while a lease is live, names the way out (lease mode off), and
// applies once leasing is off.
func TestLeaseEndMigrationNeedsLeasingOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, m := migratorAt(t, 36)
	for _, q := range []string{
		`INSERT INTO tenants (id, tokens_capacity, tokens_rate_micro, tokens_micro, tokens_at, created_at) VALUES ('acme', 1000, 1, 0, now(), now())`,
		`INSERT INTO leases (id, tenant_id, holder, state, levels, slice_micro, taken_at, renewed_at, expires_at)
		 VALUES ('l1', 'acme', 'r1', 'live', '{acme}', 10, now(), now(), now() + interval '10 seconds')`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.UpTo(ctx, 37); err == nil || !strings.Contains(err.Error(), "lease mode off") {
		t.Fatalf("migrate with a live lease: %v; want a refusal naming lease mode off", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE leases SET state = 'returned', ended_at = now()`); err != nil {
		t.Fatal(err)
	}
	if err := m.UpTo(ctx, 37); err != nil {
		t.Fatalf("migrate with leasing off: %v", err)
	}
}
