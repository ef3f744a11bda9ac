package lease

import (
	"context"
	"strings"
	"testing"

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
	for _, q := range []string{
		`INSERT INTO tenants (id, tokens_capacity, tokens_rate_micro, tokens_micro) VALUES ('t', 1000, 1, 0)`,
		`INSERT INTO leases (id, tenant_id, holder, state, levels, slice_micro, taken_at, renewed_at, expires_at)
		 SELECT 'L' || i, 't', 'h', CASE WHEN i % 100 = 0 THEN 'live' ELSE 'returned' END, ARRAY['t'], 1000, now(), now(), now()
		 FROM generate_series(1, 2000) AS i`,
		`INSERT INTO api_keys (id, tenant_id, secret_hash, created_at)
		 SELECT 'k' || i, 't', sha256(i::text::bytea), now() FROM generate_series(1, 2000) AS i`,
		`ANALYZE leases, api_keys`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
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
