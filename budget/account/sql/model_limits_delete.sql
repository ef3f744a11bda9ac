DELETE FROM tenant_model_limits WHERE tenant_id = $1 AND model = $2
