-- A group commit's use of its leases ($1 ids, $2 the group's cost on
-- each), in one statement: the leases are locked in id order (the order
-- an admin change locks a tree's, EndLocked), then each is used unless it
-- is not live, past its expiry by the store's clock ($3: a frozen clock,
-- or none) or would pass its slice; a lease refused is not returned. It
-- locks lease rows, never a tenant's.
WITH locked AS MATERIALIZED (
    SELECT id FROM leases WHERE id = ANY ($1::text[]) ORDER BY id FOR NO KEY UPDATE
)
UPDATE leases l SET used_micro = l.used_micro + u.sum
FROM unnest($1::text[], $2::bigint[]) AS u (id, sum), locked
WHERE l.id = u.id AND locked.id = u.id AND l.state = 'live'
  AND l.expires_at > coalesce($3::timestamptz, clock_timestamp())
  AND l.used_micro + u.sum <= l.slice_micro
RETURNING l.id, l.tenant_id
