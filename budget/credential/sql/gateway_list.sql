SELECT id, name, secret_hash, tenants, created_at, last_used_at, revoked_at
FROM gateway_credentials ORDER BY created_at, id
