SELECT * FROM ledger_entries
WHERE tenant_id = $1 AND seq > $2
ORDER BY seq
LIMIT $3
