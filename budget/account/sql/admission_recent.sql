-- A tenant's latest admissions, newest first: its admissions rows, and
-- those of a groups-shape journal's group rows (00039) among the last
-- 10,000 groups (the dashboard's chart wants the latest; reading further
-- back for a tenant with few leased admissions would read every group).
SELECT * FROM (
    (SELECT id, tenant_id, state, model, input_tokens, output_tokens, cost, approximate, input_weight_micro,
       output_weight_micro, created_at, expires_at, ended_at, late, actual_input, actual_output,
       actual_cost, end_delta_micro, end_balance_micro, shadowed, family, model_levels, pool_id,
       price_model, price_from, price_tier, money_estimate, money_actual, face, debited_micro
     FROM admissions
     WHERE tenant_id = $1
     ORDER BY created_at DESC
     LIMIT $2)
    UNION ALL
    (SELECT id, tenant_id, state, model, input_tokens, output_tokens, cost, approximate, input_weight_micro,
       output_weight_micro, created_at, expires_at, ended_at, late, actual_input, actual_output,
       actual_cost, end_delta_micro, end_balance_micro, shadowed, family, model_levels, pool_id,
       price_model, price_from, price_tier, money_estimate, money_actual, face, debited_micro
     FROM lease_group_admissions
     WHERE tenant_id = $1 AND group_seq > (SELECT coalesce(max(seq), 0) - 10000 FROM lease_groups)
     ORDER BY created_at DESC
     LIMIT $2)
) a
ORDER BY created_at DESC
LIMIT $2
