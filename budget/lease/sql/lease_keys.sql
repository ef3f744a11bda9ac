-- The keys a journal group's admissions came with, read after the group
-- locked its leases (a statement of its own, so a snapshot taken after
-- the locks): a key revoked, or its scope changed, by a transaction that
-- locked those leases (LockLive) is seen by every group after it. A read
-- of credential's table, no lock. The row version (xmin) lets a group sent
-- in one round trip check that the row has not changed since
-- (lease_credentials_same.sql).
SELECT id, tenant_id, revoked_at IS NOT NULL, allowed_models, xmin::text FROM api_keys WHERE id = ANY($1::text[])
