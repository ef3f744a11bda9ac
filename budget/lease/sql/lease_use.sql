-- A group commit's use of its leases ($1 ids, $2 the group's cost on
-- each), in one statement: the leases are locked in id order (the order
-- an admin change locks a tree's, EndLocked), then each is used unless it
-- is not live, past its expiry by the store's clock ($3: a frozen clock,
-- or none), would pass its slice, or is not of the tenant its admissions
-- name ($4, '' for any); a lease refused is not returned. It locks lease
-- rows, never a tenant's.
--
-- $5: the group was sent in one round trip, COMMIT included, so a lease
-- refused must stop it (lease_journal_guard, 00035); the journal then
-- writes it the careful way, where a refused lease's admissions are
-- answered ErrOver and the others commit.
WITH locked AS MATERIALIZED (
    SELECT id FROM leases WHERE id = ANY ($1::text[]) ORDER BY id FOR NO KEY UPDATE
), used AS (
    UPDATE leases l SET used_micro = l.used_micro + u.sum
    FROM unnest($1::text[], $2::bigint[], $4::text[]) AS u (id, sum, tenant), locked
    WHERE l.id = u.id AND locked.id = u.id AND l.state = 'live'
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
