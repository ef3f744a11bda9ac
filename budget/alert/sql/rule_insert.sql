INSERT INTO alert_rules (tenant_id, endpoint_id, kind, thresholds, limit_name, sustain_minutes)
SELECT $1, $2, $3, $4, $5, $6
WHERE EXISTS (SELECT 1 FROM alert_endpoints WHERE id = $2 AND disabled_at IS NULL)
RETURNING id, tenant_id, endpoint_id, kind, thresholds, limit_name, sustain_minutes, created_at
