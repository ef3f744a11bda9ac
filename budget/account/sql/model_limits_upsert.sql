INSERT INTO tenant_model_limits (tenant_id, model, input_capacity, input_rate_micro, output_capacity, output_rate_micro,
                                 input_micro, input_at, output_micro, output_at, shadow_limits)
VALUES ($1, $2, NULLIF($3, 0), NULLIF($4, 0), NULLIF($5, 0), NULLIF($6, 0), $7, $9, $8, $9, $10)
ON CONFLICT (tenant_id, model) DO UPDATE
SET input_capacity = excluded.input_capacity, input_rate_micro = excluded.input_rate_micro,
    output_capacity = excluded.output_capacity, output_rate_micro = excluded.output_rate_micro,
    input_micro = excluded.input_micro, input_at = excluded.input_at, output_micro = excluded.output_micro,
    output_at = excluded.output_at, shadow_limits = excluded.shadow_limits
