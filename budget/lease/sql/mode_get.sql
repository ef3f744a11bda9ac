-- A tenant's lease mode: off unless a row says otherwise; no row at all
-- when the tenant does not exist.
SELECT coalesce(m.mode, 'off')
FROM tenants t LEFT JOIN lease_modes m ON m.tenant_id = t.id
WHERE t.id = $1
