SELECT DISTINCT tenant_id
FROM admissions
WHERE state = 'reserved' AND expires_at <= coalesce($2::timestamptz, clock_timestamp())
LIMIT $1
