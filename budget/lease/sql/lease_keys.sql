-- The keys a journal group's admissions came with, read after the group
-- locked its leases (a statement of its own, so a snapshot taken after
-- the locks): a key revoked, or its scope changed, by a transaction that
-- locked those leases (LockLive) is seen by every group after it. A read
-- of credential's table, no lock.
SELECT id, tenant_id, revoked_at IS NOT NULL, allowed_models FROM api_keys WHERE id = ANY($1::text[])
