SELECT model, pool_id FROM pool_models
