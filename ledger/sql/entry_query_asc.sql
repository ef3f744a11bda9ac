SELECT tenant_id, seq, kind, created_at, admission_id, model, estimate, actual, refill_micro, delta_micro,
       balance_micro, period_start, period_used, late, actor, reason, detail, prev_hash, hash, money_micro,
       windows
FROM ledger_entries
WHERE ($1 = '' OR tenant_id = $1)
  AND ($2 = '' OR kind = $2)
  AND ($3 = '' OR model = $3)
  AND ($4 = '' OR admission_id = $4)
  AND ($5 = '' OR actor = $5)
  AND ($6::timestamptz IS NULL OR created_at >= $6)
  AND ($7::timestamptz IS NULL OR created_at < $7)
  AND ($8::timestamptz IS NULL OR created_at >= $8) -- lets a tenant's index start at the cursor
  AND ($8::timestamptz IS NULL OR (created_at, tenant_id, seq) > ($8, $9, $10))
ORDER BY created_at, tenant_id, seq
LIMIT $11
