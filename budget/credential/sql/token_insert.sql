INSERT INTO admin_tokens (id, name, secret_hash)
VALUES ($1, $2, $3)
RETURNING created_at
