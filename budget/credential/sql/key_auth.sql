SELECT k.tenant_id, k.secret_hash, k.revoked_at IS NOT NULL, t.disabled_at IS NOT NULL
FROM api_keys k
JOIN tenants t ON t.id = k.tenant_id
WHERE k.id = $1
