SELECT * FROM tenant_model_limits WHERE tenant_id = $1 ORDER BY model
