-- The live leases a gateway credential may admit through: those of the
-- tenants in its scope, or every live lease when its scope is every tenant
-- ('*'). Locked by id (the journal's order), so that no journal group of
-- theirs is in flight as the gateway's revoke commits, and every group
-- after it reads the gateway as revoked.
SELECT id
FROM leases
WHERE state = 'live' AND ('*' = ANY ($1::text[]) OR tenant_id = ANY ($1::text[]))
ORDER BY id
FOR UPDATE
