SELECT id, tenant_id, endpoint_id, kind, thresholds, limit_name, sustain_minutes, created_at
FROM alert_rules
WHERE deleted_at IS NULL AND ($1::text IS NULL OR tenant_id = $1 OR tenant_id IS NULL)
ORDER BY id
