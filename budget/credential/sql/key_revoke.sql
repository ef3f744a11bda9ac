UPDATE api_keys SET revoked_at = clock_timestamp()
WHERE id = $1 AND tenant_id = $2 AND revoked_at IS NULL
