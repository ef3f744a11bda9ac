SELECT DISTINCT tenant_id
FROM admissions
WHERE state = 'reserved' AND expires_at <= clock_timestamp()
LIMIT $1
