-- The live leases taken at a level of a tree (the tenant's own and its
-- descendants'), locked after the tree's tenant rows (the one lock order:
-- tenants, then leases, by id), so that no journal group of theirs is in
-- flight while an admin change ends them, and none begins before it
-- commits.
SELECT id, tenant_id, slice_micro, used_micro, expires_at
FROM leases
WHERE state = 'live' AND $1 = ANY (levels)
ORDER BY id
FOR UPDATE
