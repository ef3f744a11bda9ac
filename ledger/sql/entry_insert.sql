INSERT INTO ledger_entries (
    tenant_id, seq, kind, created_at, admission_id, model, estimate, actual,
    refill_micro, delta_micro, balance_micro, period_start, period_used, late,
    actor, reason, detail, prev_hash, hash
) VALUES (
    $1, $2, $3, $4, NULLIF($5, ''), NULLIF($6, ''), $7, $8,
    $9, $10, $11, $12, $13, $14,
    $15, NULLIF($16, ''), NULLIF($17, ''), $18, $19
)
