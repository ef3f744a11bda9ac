-- The gateway credentials a journal group's admissions came through,
-- unrevoked, with their scopes, read after the group locked its leases (a
-- statement of its own, so a snapshot taken after the locks): a gateway
-- revoked by a transaction that locked those leases (LockLiveGateway) is
-- seen by every group after it. A read of credential's table, no lock. The
-- row version (xmin): as lease_keys.sql's.
SELECT id, tenants, xmin::text FROM gateway_credentials WHERE id = ANY($1::text[]) AND revoked_at IS NULL
