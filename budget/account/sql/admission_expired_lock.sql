-- Up to $2 overdue reservations of each of a batch's tenants (the time
-- computed once, see admission_expired_tenants.sql), locked after the
-- tenants, tenant by tenant in id order; those another replica's sweep
-- holds are skipped.
SELECT a.*
FROM unnest($1::text[]) AS t (id)
CROSS JOIN LATERAL (
    SELECT * FROM admissions
    WHERE tenant_id = t.id AND state = 'reserved'
      AND expires_at <= (SELECT coalesce($3::timestamptz, clock_timestamp()))
    ORDER BY expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
) AS a
