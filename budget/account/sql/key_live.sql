-- The unrevoked keys among those a batch's requests came with. The table is
-- credential's; a decision only reads it, so that the check that a key was
-- not revoked rides in the decision's own round trip instead of a query of
-- its own per request.
SELECT id, tenant_id, priority, allowed_models FROM api_keys WHERE id = ANY($1::text[]) AND revoked_at IS NULL
