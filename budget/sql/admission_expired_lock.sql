-- A tenant's overdue reservations (the time computed once, see
-- admission_expired_tenants.sql), locked; those another sweeper holds are
-- skipped.
SELECT * FROM admissions
WHERE tenant_id = $1 AND state = 'reserved'
  AND expires_at <= (SELECT coalesce($3::timestamptz, clock_timestamp()))
ORDER BY expires_at
LIMIT $2
FOR UPDATE SKIP LOCKED
