-- The first row storing a tenant's entries after a seq ($2), whatever its
-- size: EntryList reads it when no row ends within its range (a record
-- longer than the range), so that a read always moves on.
SELECT seq, kind, created_at, admission_id, model, estimate, actual, refill_micro, delta_micro, balance_micro,
       period_start, period_used, late, actor, reason, detail, prev_hash, hash, money_micro, windows,
       earlier_prev, earlier_kinds, earlier_admissions, earlier_models, earlier_estimates, earlier_actuals,
       earlier_refills, earlier_money, earlier_actors, earlier_reasons, earlier_details, earlier_hashes
FROM ledger_rows
WHERE tenant_id = $1 AND seq > $2
ORDER BY seq
LIMIT 1
