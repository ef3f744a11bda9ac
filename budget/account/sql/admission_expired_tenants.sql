-- Tenants with overdue reservations. The time is computed once (an
-- InitPlan), so the partial index on expires_at bounds the scan; a
-- volatile clock_timestamp() in the condition would scan every open
-- reservation.
SELECT DISTINCT tenant_id
FROM admissions
WHERE state = 'reserved' AND expires_at <= (SELECT coalesce($2::timestamptz, clock_timestamp()))
LIMIT $1
