-- The seq of a tenant's last entry (no row for none): its last row's, the
-- end of its range of the primary key. Ordered as the key is, so that no
-- plan sorts or counts a tenant's rows (an aggregate's max() on a small
-- table read the tenant's whole created_at index).
SELECT seq FROM ledger_rows WHERE tenant_id = $1 ORDER BY tenant_id DESC, seq DESC LIMIT 1
