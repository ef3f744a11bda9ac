INSERT INTO api_keys (id, tenant_id, secret_hash)
VALUES ($1, $2, $3)
RETURNING created_at
