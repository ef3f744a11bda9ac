UPDATE api_keys SET priority = $3 WHERE id = $1 AND tenant_id = $2 AND revoked_at IS NULL
