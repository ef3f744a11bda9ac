SELECT id, name, created_at, last_used_at, revoked_at
FROM admin_tokens
ORDER BY created_at, id
