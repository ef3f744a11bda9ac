-- One page of entries, oldest first. ledger_entries gives each entry as a
-- row whatever its storage (00038): the row_* columns are the storing
-- row's, which its indexes know. A record's entries share its created_at
-- and tenant and end at its row_seq, so ordering by the row, then the
-- entry, orders the entries, and a row holds entries after the cursor only
-- if its row_seq is not before it. An admission's entries are its own rows
-- (row_admission_id) or inside its lease's records (row_lease_id, $12).
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
  AND ($8::timestamptz IS NULL OR created_at >= $8) -- lets a tenant's index start at the cursor
  AND ($8::timestamptz IS NULL OR (created_at, tenant_id, row_seq) >= ($8, $9, $10))
  AND ($8::timestamptz IS NULL OR (created_at, tenant_id, seq) > ($8, $9, $10))
ORDER BY created_at, tenant_id, row_seq, seq
LIMIT $11
