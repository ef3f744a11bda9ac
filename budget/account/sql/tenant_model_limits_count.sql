-- A tenant's count of model limits, kept under its row lock (see tenant_lock.sql).
UPDATE tenants SET model_limits = model_limits + $2 WHERE id = $1
