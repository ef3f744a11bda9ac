SELECT model, pool_id FROM pool_models WHERE model = ANY($1::text[])
