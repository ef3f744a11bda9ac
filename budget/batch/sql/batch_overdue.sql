-- Open batches past their completion window, oldest first.
SELECT id, tenant_id FROM batches WHERE state = 'open' AND expires_at <= $1 ORDER BY expires_at LIMIT $2
