-- The tenants whose lease mode is auto (a replica's copy, ModeCached).
SELECT tenant_id FROM lease_modes WHERE mode = 'auto'
