-- One page of entries, newest first: entry_query_asc.sql, backwards. A
-- row holds entries before the cursor only if its created_at is not after
-- the cursor's: the index starts there.
SELECT tenant_id, seq, kind, created_at, admission_id, model, estimate, actual, refill_micro, delta_micro,
       balance_micro, period_start, period_used, late, actor, reason, detail, prev_hash, hash, money_micro,
       windows
FROM ledger_entries
WHERE ($1 = '' OR tenant_id = $1)
  AND ($2 = '' OR kind = $2)
  AND ($3 = '' OR model = $3)
  AND ($4 = '' OR (admission_id = $4 AND (row_admission_id = $4 OR row_lease_id = $12)))
  AND ($5 = '' OR actor = $5)
  AND ($6::timestamptz IS NULL OR created_at >= $6)
  AND ($7::timestamptz IS NULL OR created_at < $7)
  AND ($8::timestamptz IS NULL OR created_at <= $8) -- lets a tenant's index start at the cursor
  AND ($8::timestamptz IS NULL OR (created_at, tenant_id, seq) < ($8, $9, $10))
ORDER BY created_at DESC, tenant_id DESC, row_seq DESC, seq DESC
LIMIT $11
