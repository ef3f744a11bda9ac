SELECT tenant_id, seq, kind, created_at, coalesce(admission_id, ''), coalesce(model, ''), estimate, actual,
       refill_micro, delta_micro, balance_micro, period_start, period_used, late,
       actor, coalesce(reason, ''), coalesce(detail, ''), prev_hash, hash
FROM ledger_entries
WHERE tenant_id = $1 AND seq > $2
ORDER BY seq
LIMIT $3
