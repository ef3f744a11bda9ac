-- The Idempotency-Keys among a lease journal group's (tenant, key) pairs
-- that are forgotten (older than 24 h, not purged yet), deleted before the
-- group inserts its own rows for those keys: the group's insert
-- (admission_insert_leased.sql) is a plain one, so that a key it finds
-- stops it. Only the careful way runs this, holding the keys' advisory
-- locks, after reading the live ones (idempotency_get.sql; live is created
-- after the clock less 24 h, forgotten is at or before it).
--
-- Each pair is looked up on its own down the primary key, as
-- idempotency_get.sql does, and deleted by its row's address: one plan,
-- whatever the statistics.
DELETE FROM idempotency_keys
WHERE ctid = ANY (ARRAY(
    SELECT i.ctid
    FROM unnest($1::text[], $2::text[]) AS k (tenant_id, key)
    CROSS JOIN LATERAL (
        SELECT i.ctid
        FROM idempotency_keys i
        WHERE i.tenant_id = k.tenant_id AND i.key = k.key
          AND i.created_at <= coalesce($3::timestamptz, clock_timestamp()) - interval '24 hours'
        LIMIT 1
    ) i
))
