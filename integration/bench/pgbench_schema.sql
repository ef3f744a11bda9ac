-- The cheapest possible admission, for pgbench: a tenant's balance and a
-- ledger row, one statement (and so one commit) per admission.
DROP TABLE IF EXISTS bench_ledger, bench_tenants;
CREATE TABLE bench_tenants (id integer PRIMARY KEY, tokens bigint NOT NULL);
CREATE TABLE bench_ledger (
    id         bigserial   PRIMARY KEY,
    tenant_id  integer     NOT NULL,
    cost       bigint      NOT NULL,
    balance    bigint      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
INSERT INTO bench_tenants SELECT g, 1000000000000 FROM generate_series(1, 64) g;
