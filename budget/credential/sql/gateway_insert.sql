INSERT INTO gateway_credentials (id, name, secret_hash, tenants)
VALUES ($1, $2, $3, $4)
RETURNING created_at
