package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tokengate/tokengate/budget/account"
	"github.com/tokengate/tokengate/integration/pgtest"
)

// A journal group's own statements (the lease use, the cut-back of what
// was not journaled, the key and gateway reads, the check that the
// credentials are as read) run under the settings a
// group begins with (account.QueueGenericPlans: generic plans, scans priced
// out, no JIT), as account's statements do (its TestGenericPlansStayIndexed).
// leases keeps every lease ever taken; as a generic plan, the cut-back
// joined them by a scan of the whole table. Each must read the rows it
// names through an index, and none may be compiled, on a table of many
// leases and many keys.
func TestJournalPlansStayIndexed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	manyLeases(ctx, t, pool, `'L' || i`, `i % 100 = 0`, `now()`,
		`INSERT INTO api_keys (id, tenant_id, secret_hash, created_at)
		 SELECT 'k' || i, 't', sha256(i::text::bytea), now() FROM generate_series(1, 2000) AS i`,
		`ANALYZE leases, api_keys`)
	for _, c := range []struct {
		name, sql, args, table string
	}{
		{"lease use", leaseUseSQL, `ARRAY['L100'], ARRAY[1], NULL, ARRAY[''], false`, "leases"},
		{"lease use in one round trip", leaseUseSQL, `ARRAY['L100'], ARRAY[1], NULL, ARRAY['t'], true`, "leases"},
		{"credentials check", leaseCredentialsSameSQL, `ARRAY['k1'], ARRAY['1'], ARRAY[]::text[], ARRAY[]::text[]`, "api_keys"},
		{"cut-back", leaseUnuseSQL, `ARRAY['L100'], ARRAY[1]`, "leases"},
		{"key read", leaseKeysSQL, `ARRAY['k1']`, "api_keys"},
		{"a tenant's leases' unused part", leaseUnusedSQL, `'t', 'L100'`, "leases"},
	} {
		plan := pgtest.GenericPlan(ctx, t, pool, account.QueueGenericPlans, c.sql, c.args)
		if strings.Contains(plan, "Seq Scan on "+c.table) {
			t.Errorf("%s, in a journal group, scans all of %s:\n%s", c.name, c.table, plan)
		}
		if strings.Contains(plan, "JIT") {
			t.Errorf("%s, in a journal group, is compiled (JIT):\n%s", c.name, plan)
		}
	}
}

// A journal group's lease use names its leases by id, and the live ones
// are a share of the table that moves: few while few tenants lease, every
// replica's lease of every leased tenant later. A generic plan made while
// few were live read the use's leases through leases_tenant_idx, every
// live lease, and hashed them against the ids: a cost that grows with
// every live lease, and locks taken in the tenants' order. The use reads
// by id, whatever share is live.
func TestLeaseUseReadsByID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	manyLeases(ctx, t, pool, `'L' || lpad(i::text, 4, '0')`, `i % 1000 = 0`, `now() + interval '1 hour'`, `ANALYZE leases`)
	plan := pgtest.GenericPlan(ctx, t, pool, account.QueueGenericPlans, leaseUseSQL,
		`ARRAY['L1000', 'L2000'], ARRAY[1, 1], NULL, ARRAY['', ''], true`)
	if strings.Contains(plan, "leases_tenant_idx") || strings.Contains(plan, "leases_live_expiry_idx") || !strings.Contains(plan, "leases_pkey") {
		t.Errorf("the lease use does not read its leases by id (leases_pkey) alone:\n%s", plan)
	}
}

// A journal group's lease use locks its leases in id order, as an admin
// change locks a tree's (EndLocked), so that the two never wait on each
// other in a cycle; since the use takes the locks by its update alone (no
// lock of its own first), the order is its plan's. The test holds the
// middle lease of twenty from another transaction and runs the use over
// all twenty: once it waits, the leases before the middle one must be
// locked by it and those after it free. On a table of many leases, as
// TestJournalPlansStayIndexed, with a group's plan settings.
func TestLeaseUseLocksInIDOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t, nil)
	// Written in reverse id order, so that a plan reading the leases in
	// any order of the heap's, or of leases_tenant_idx's (one tenant: the
	// heap's), locks them in reverse.
	manyLeases(ctx, t, pool, `'L' || lpad((2001 - i)::text, 4, '0')`, `i > 1980`, `now() + interval '1 hour'`, `ANALYZE leases`)
	ids, sums, tenants := make([]string, 20), make([]int64, 20), make([]string, 20)
	for i := range ids {
		ids[i], sums[i] = fmt.Sprintf("L%04d", i+1), 1
	}
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, "SELECT 1 FROM leases WHERE id = 'L0010' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	group, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = group.Rollback(ctx) }()
	b := &pgx.Batch{}
	account.QueueGenericPlans(b)
	if err := group.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := group.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		rows, err := group.Query(ctx, leaseUseSQL, ids, sums, nil, tenants, false)
		if err == nil {
			rows.Close()
			err = rows.Err()
		}
		done <- err
	}()
	// The signal: the group's backend waits on a lock.
	for waiting := false; !waiting; {
		select {
		case err := <-done:
			t.Fatalf("the lease use finished (%v) with L0010 held elsewhere", err)
		default:
		}
		if err := pool.QueryRow(ctx, "SELECT wait_event_type IS NOT DISTINCT FROM 'Lock' FROM pg_stat_activity WHERE pid = $1", pid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range ids {
		if id == "L0010" {
			continue
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tx.Exec(ctx, "SELECT 1 FROM leases WHERE id = $1 FOR UPDATE NOWAIT", id)
		_ = tx.Rollback(ctx)
		var pe *pgconn.PgError
		locked := errors.As(err, &pe) && pe.Code == "55P03" // lock_not_available
		if err != nil && !locked {
			t.Fatalf("lease %s: %v", id, err)
		}
		if want := i < 9; locked != want {
			t.Errorf("lease %s, waiting on L0010: locked by the group %v, want %v (err %v)", id, locked, want, err)
		}
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// manyLeases makes tenant t and 2000 leases of it, their ids and expiries
// the SQL expressions given of i (1 to 2000), live where the condition of i
// holds (the others returned), then runs more.
func manyLeases(ctx context.Context, t *testing.T, pool *pgxpool.Pool, id, live, expires string, more ...string) {
	t.Helper()
	seed(ctx, t, pool, append([]string{
		`INSERT INTO tenants (id, tokens_capacity, tokens_rate_micro, tokens_micro) VALUES ('t', 1000, 1, 0)`,
		`INSERT INTO leases (id, tenant_id, holder, state, levels, slice_micro, taken_at, renewed_at, expires_at)
		 SELECT ` + id + `, 't', 'h', CASE WHEN ` + live + ` THEN 'live' ELSE 'returned' END, ARRAY['t'], 1000, now(), now(), ` + expires + `
		 FROM generate_series(1, 2000) AS i`,
	}, more...)...)
}

// seed runs a test's setup statements, in order.
func seed(ctx context.Context, t *testing.T, pool *pgxpool.Pool, stmts ...string) {
	t.Helper()
	for _, q := range stmts {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}
