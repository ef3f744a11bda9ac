-- A tenant's entries after a seq, in order. ledger_entries gives each entry
-- as a row whatever its storage (00038); row_seq is the seq of the row that
-- stores it, the last of its record's, so the primary key starts the scan
-- at the first row holding an entry after $2, and the rows' entries come
-- in order within each row.
SELECT tenant_id, seq, kind, created_at, admission_id, model, estimate, actual, refill_micro, delta_micro,
       balance_micro, period_start, period_used, late, actor, reason, detail, prev_hash, hash, money_micro,
       windows
FROM ledger_entries
WHERE tenant_id = $1 AND row_seq > $2 AND seq > $2
ORDER BY row_seq, seq
LIMIT $3
