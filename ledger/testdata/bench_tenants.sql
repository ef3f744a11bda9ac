-- The tenant rows for bench_load.sql, with their chain heads and balances.
INSERT INTO tenants (id, tokens_capacity, tokens_rate_micro, tokens_micro, tokens_at, ledger_seq, ledger_hash)
SELECT e.tenant_id, 1000000, 1000000, e.balance_micro, e.created_at, e.seq, e.hash
FROM ledger_entries e
WHERE e.seq = $1::int AND e.tenant_id LIKE 'bench-%'
