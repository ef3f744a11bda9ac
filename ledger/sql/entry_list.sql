-- The rows that store a tenant's entries after a seq ($2) up to another
-- ($3), whole, in order: read from ledger_rows itself, not through the
-- ledger_entries view, and expanded by the caller (EntryList). A row is
-- its last entry's (row seq), so the rows ending in ($2, $3] hold every
-- entry of that range but those of a record that ends beyond $3, which the
-- next read starts with. Through the view, Postgres unnested each record
-- into rows and sorted them back: a verification (the invariant watch that
-- every replica runs, ledger verify) cost it about 11 us per entry
-- (BenchmarkVerifyRecords); a row with its arrays, sent as they are
-- stored, costs a fraction of that.
SELECT seq, kind, created_at, admission_id, model, estimate, actual, refill_micro, delta_micro, balance_micro,
       period_start, period_used, late, actor, reason, detail, prev_hash, hash, money_micro, windows,
       earlier_prev, earlier_kinds, earlier_admissions, earlier_models, earlier_estimates, earlier_actuals,
       earlier_refills, earlier_money, earlier_actors, earlier_reasons, earlier_details, earlier_hashes
FROM ledger_rows
WHERE tenant_id = $1 AND seq > $2 AND seq <= $3
ORDER BY seq
