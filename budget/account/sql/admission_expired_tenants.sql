-- Tenants with overdue reservations. The time is computed once (an
-- InitPlan), so the partial index on expires_at bounds the scan; a
-- volatile clock_timestamp() in the condition would scan every open
-- reservation. Leased admissions not booked yet are left for later
-- (admission_expired_lock.sql).
SELECT DISTINCT tenant_id
FROM admissions
WHERE state = 'reserved' AND expires_at <= (SELECT coalesce($2::timestamptz, clock_timestamp()))
  AND (lease_id IS NULL
       OR lease_seq <= coalesce((SELECT b.booked_seq FROM admission_lease_books b WHERE b.lease_id = admissions.lease_id), 0))
LIMIT $1
