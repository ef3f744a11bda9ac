-- Sums are numeric, exact however large: each term fits a bigint, their
-- sum may not (budget.Total scans them). Admissions rows and a
-- groups-shape journal's group rows (00039) alike.
SELECT '*' AS tenant_id, model, count(*) AS admissions,
       sum(input_tokens::numeric) AS estimated_input_tokens, sum(output_tokens::numeric) AS estimated_output_tokens,
       sum(cost::numeric) AS estimated_cost,
       coalesce(sum(actual_input::numeric), 0) AS actual_input_tokens, coalesce(sum(actual_output::numeric), 0) AS actual_output_tokens,
       coalesce(sum(actual_cost::numeric), 0) AS actual_cost,
       count(*) FILTER (WHERE state = 'settled') AS settled,
       count(*) FILTER (WHERE state = 'expired' OR late) AS expired,
       coalesce(avg((cost::numeric - actual_cost)::float8 / greatest(actual_cost, 1)) FILTER (WHERE state = 'settled'), 0) AS mean_relative_error,
       coalesce(percentile_cont(0.95) WITHIN GROUP (ORDER BY abs((cost::numeric - actual_cost)::float8 / greatest(actual_cost, 1)))
                FILTER (WHERE state = 'settled'), 0) AS p95_abs_relative_error,
       coalesce(sum(end_delta_micro::numeric) FILTER (WHERE end_delta_micro > 0), 0) AS refunded_micro,
       coalesce(-sum(end_delta_micro::numeric) FILTER (WHERE end_delta_micro < 0), 0) AS extra_charged_micro,
       count(*) FILTER (WHERE cardinality(shadowed) > 0) AS shadow_refused,
       count(money_estimate) AS priced,
       coalesce(sum(money_estimate::numeric), 0) AS estimated_money_micro,
       coalesce(sum(money_actual::numeric), 0) AS actual_money_micro,
       coalesce(sum((money_estimate - money_actual)::numeric) FILTER (WHERE state = 'settled'), 0) AS money_drift_micro
FROM (
    SELECT id, tenant_id, state, model, input_tokens, output_tokens, cost, approximate, input_weight_micro,
       output_weight_micro, created_at, expires_at, ended_at, late, actual_input, actual_output,
       actual_cost, end_delta_micro, end_balance_micro, shadowed, family, model_levels, pool_id,
       price_model, price_from, price_tier, money_estimate, money_actual, face, debited_micro FROM admissions
    UNION ALL
    SELECT id, tenant_id, state, model, input_tokens, output_tokens, cost, approximate, input_weight_micro,
       output_weight_micro, created_at, expires_at, ended_at, late, actual_input, actual_output,
       actual_cost, end_delta_micro, end_balance_micro, shadowed, family, model_levels, pool_id,
       price_model, price_from, price_tier, money_estimate, money_actual, face, debited_micro FROM lease_group_admissions
) a
WHERE ($1 = '' OR tenant_id = $1)
  AND ($2 = '' OR model = $2)
  AND created_at >= $3 AND created_at < $4
GROUP BY model
ORDER BY model
