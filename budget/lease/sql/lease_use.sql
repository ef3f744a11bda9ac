-- A group commit's use of its leases ($1 ids, sorted; $2 the group's
-- cost on each), in one statement: each lease is used unless it is not
-- live, past its expiry by the store's clock ($3: a frozen clock, or
-- none), would pass its slice, or is not of the tenant its admissions name
-- ($4, '' for any); a lease refused is not returned. It locks lease rows,
-- never a tenant's.
--
-- The update takes each row's lock itself, in id order (the order an admin
-- change locks a tree's, EndLocked): every plan of this join reads the
-- leases in the order of the sorted ids or of leases_pkey, which is the
-- same order (TestLeaseUseLocksInIDOrder). A lock taken first, in a CTE of
-- its own, cost a second write of each row (its lock, then its update):
-- with 64 tenants a group uses about 15 leases, and without it a replica
-- answered 1.10x the admissions (BENCHMARKS.md, "Quota leasing, seventh
-- step").
--
-- $5: the group was sent in one round trip, COMMIT included, so a lease
-- refused must stop it (lease_journal_guard, 00035); the journal then
-- writes it the careful way, where a refused lease's admissions are
-- answered ErrOver and the others commit.
WITH used AS (
    UPDATE leases l SET used_micro = l.used_micro + u.sum
    FROM unnest($1::text[], $2::bigint[], $4::text[]) AS u (id, sum, tenant)
    -- Found by id (leases_pkey) alone: "state = 'live'" written as is
    -- let a generic plan made while few leases were live read
    -- leases_tenant_idx, every live lease, in the tenants' order, not the
    -- ids' (TestLeaseUseReadsByID). As an IS TRUE test it proves nothing
    -- of the partial indexes' predicate.
    WHERE l.id = u.id AND (l.state = 'live') IS TRUE
      AND l.expires_at > coalesce($3::timestamptz, clock_timestamp())
      AND l.used_micro + u.sum <= l.slice_micro
      AND (u.tenant = '' OR l.tenant_id = u.tenant)
    RETURNING l.id, l.tenant_id
)
SELECT id, tenant_id FROM used
UNION ALL
SELECT NULL, NULL
WHERE NOT lease_journal_guard(NOT $5::boolean OR (SELECT count(*) FROM used) = cardinality($1::text[]),
                              'a lease refused the group')
