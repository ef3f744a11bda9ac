SELECT id, tenant_id, created_at, last_used_at, revoked_at, priority, allowed_models
FROM api_keys
WHERE tenant_id = $1
ORDER BY created_at, id
