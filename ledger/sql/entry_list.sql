SELECT tenant_id, seq, kind, created_at, admission_id, model, estimate, actual, refill_micro, delta_micro,
       balance_micro, period_start, period_used, late, actor, reason, detail, prev_hash, hash, money_micro,
       windows
FROM ledger_entries
WHERE tenant_id = $1 AND seq > $2
ORDER BY seq
LIMIT $3
