-- The seq of a tenant's last entry (0 for none): its last row's, found
-- down the primary key.
SELECT coalesce(max(seq), 0) FROM ledger_rows WHERE tenant_id = $1
