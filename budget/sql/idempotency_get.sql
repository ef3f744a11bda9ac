SELECT admission_id, request_hash, response
FROM idempotency_keys
WHERE tenant_id = $1 AND key = $2 AND created_at > coalesce($3::timestamptz, clock_timestamp()) - interval '24 hours'
