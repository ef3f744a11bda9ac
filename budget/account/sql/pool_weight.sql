INSERT INTO pool_shares (pool_id, tenant_id, weight) VALUES ($1, $2, $3)
ON CONFLICT (pool_id, tenant_id) DO UPDATE SET weight = excluded.weight
