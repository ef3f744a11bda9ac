-- The leased admissions to book before a batch ends the admissions it
-- names (by id, $1, or by a tenant's live Idempotency-Key, $2 and $3, as
-- admission_lock.sql, which runs just before this in the same round trip):
-- for each lease of a named admission whose entries are still to write,
-- every admission of the lease above its booking cursor, in lease_seq
-- order, with the cursor moved past them (admission_lease_book.sql). The
-- batch holds the tenant rows of the leases' trees, so no other booking of
-- them runs; the batch writes their entries before its own.
WITH named AS (
    SELECT k.admission_id
    FROM idempotency_keys k
    JOIN unnest($2::text[], $3::text[]) AS q (tenant_id, key) ON k.tenant_id = q.tenant_id AND k.key = q.key
    WHERE k.created_at > coalesce($4::timestamptz, clock_timestamp()) - interval '24 hours'
), cursors AS MATERIALIZED (
    SELECT DISTINCT a.lease_id, c.seq
    FROM admissions a
    CROSS JOIN LATERAL (SELECT coalesce((SELECT b.booked_seq FROM admission_lease_books b WHERE b.lease_id = a.lease_id), 0) AS seq) c
    WHERE a.id = ANY ($1::text[] || ARRAY(SELECT admission_id FROM named))
      AND a.lease_id IS NOT NULL AND a.lease_seq > c.seq
), todo AS MATERIALIZED (
    SELECT a.lease_id, a.id, a.tenant_id, a.model, a.cost, a.money_estimate, a.created_at,
           coalesce(a.lease_actor, '') AS actor, a.lease_seq
    FROM cursors c
    JOIN admissions a ON a.lease_id = c.lease_id AND a.lease_seq > c.seq
), moved AS (
    INSERT INTO admission_lease_books (lease_id, booked_seq)
    SELECT lease_id, max(lease_seq) FROM todo GROUP BY lease_id
    ON CONFLICT (lease_id) DO UPDATE SET booked_seq = excluded.booked_seq
)
SELECT lease_id, id, tenant_id, model, cost, money_estimate, created_at, actor, lease_seq
FROM todo ORDER BY lease_id, lease_seq
