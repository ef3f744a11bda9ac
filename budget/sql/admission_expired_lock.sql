SELECT * FROM admissions
WHERE tenant_id = $1 AND state = 'reserved' AND expires_at <= coalesce($3::timestamptz, clock_timestamp())
ORDER BY expires_at
LIMIT $2
FOR UPDATE SKIP LOCKED
