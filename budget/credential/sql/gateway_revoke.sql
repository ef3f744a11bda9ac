UPDATE gateway_credentials SET revoked_at = clock_timestamp() WHERE id = $1 AND revoked_at IS NULL RETURNING tenants
