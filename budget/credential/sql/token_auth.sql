SELECT id, name, secret_hash, revoked_at IS NOT NULL
FROM admin_tokens
WHERE id = $1
