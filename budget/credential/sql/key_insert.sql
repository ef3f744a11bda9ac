INSERT INTO api_keys (id, tenant_id, secret_hash, allowed_models)
VALUES ($1, $2, $3, $4)
RETURNING created_at
