INSERT INTO pool_models (model, pool_id) VALUES ($1, $2)
ON CONFLICT (model) DO UPDATE SET pool_id = excluded.pool_id
