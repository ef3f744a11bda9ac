-- Sets a tenant's batch allowance, keeping what is enqueued.
INSERT INTO batch_allowances (tenant_id, capacity_micro, updated_at) VALUES ($1, $2, $3)
ON CONFLICT (tenant_id) DO UPDATE SET capacity_micro = $2, updated_at = $3
