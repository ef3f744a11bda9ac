-- The unrevoked gateways among those a batch's requests came through, with
-- the tenants each may name. The table is credential's; a decision only
-- reads it, so that the check that a gateway was not revoked rides in the
-- decision's own round trip instead of a query of its own per call. Read
-- after the tenant locks, in a statement of its own: a revocation committed
-- before the batch's locks were held is seen.
SELECT id, tenants FROM gateway_credentials WHERE id = ANY($1::text[]) AND revoked_at IS NULL
