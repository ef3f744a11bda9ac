-- A tenant's lease mode set, under its row lock.
INSERT INTO lease_modes (tenant_id, mode, updated_at, actor) VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant_id) DO UPDATE SET mode = excluded.mode, updated_at = excluded.updated_at, actor = excluded.actor
