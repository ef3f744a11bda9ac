-- What a tenant's other live leases ($2 excepted: the lease being renewed,
-- whose row the caller holds) hold unused: the budget taken from the
-- tenant that no admission used yet. Read under the tenant's row lock,
-- which every take, renew, return and sweep of its leases holds, so the
-- sum can only shrink while the lock is held (a journal group only adds
-- to used). A lease past its expiry and not swept yet still holds its
-- budget, and counts.
SELECT coalesce(sum(slice_micro - used_micro), 0)::bigint FROM leases
WHERE tenant_id = $1 AND state = 'live' AND id <> $2
