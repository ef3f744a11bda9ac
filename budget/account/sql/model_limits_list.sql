SELECT tenant_id, model, input_capacity, input_rate_micro, output_capacity, output_rate_micro, input_micro,
       input_at, output_micro, output_at, shadow_limits
FROM tenant_model_limits WHERE tenant_id = $1 ORDER BY model
