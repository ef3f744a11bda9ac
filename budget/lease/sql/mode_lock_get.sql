-- A tenant's lease mode, read under its row lock.
SELECT coalesce((SELECT mode FROM lease_modes WHERE tenant_id = $1), 'off')
