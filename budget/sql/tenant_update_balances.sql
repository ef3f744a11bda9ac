UPDATE tenants
SET tokens_micro = $2, tokens_at = $3, requests_micro = $4, requests_at = $5,
    open_reservations = $6, period_start = $7, period_used = $8,
    ledger_seq = $9, ledger_hash = $10
WHERE id = $1
