SELECT id, tenant_id, state, model, input_tokens, output_tokens, cost, approximate, input_weight_micro,
       output_weight_micro, created_at, expires_at, ended_at, late, actual_input, actual_output,
       actual_cost, end_delta_micro, end_balance_micro, shadowed, family, model_levels, pool_id,
       price_model, price_from, price_tier, money_estimate, money_actual, face, debited_micro
FROM admissions
WHERE tenant_id = $1
ORDER BY created_at DESC
LIMIT $2
