SELECT '*' AS tenant_id, model, count(*),
       sum(input_tokens), sum(output_tokens), sum(cost),
       coalesce(sum(actual_input), 0), coalesce(sum(actual_output), 0), coalesce(sum(actual_cost), 0),
       count(*) FILTER (WHERE state = 'settled'),
       count(*) FILTER (WHERE state = 'expired' OR late),
       coalesce(avg((cost - actual_cost)::float8 / greatest(actual_cost, 1)) FILTER (WHERE state = 'settled'), 0),
       coalesce(percentile_cont(0.95) WITHIN GROUP (ORDER BY abs((cost - actual_cost)::float8 / greatest(actual_cost, 1)))
                FILTER (WHERE state = 'settled'), 0),
       coalesce(sum(end_delta_micro) FILTER (WHERE end_delta_micro > 0), 0),
       coalesce(-sum(end_delta_micro) FILTER (WHERE end_delta_micro < 0), 0)
FROM admissions
WHERE ($1 = '' OR tenant_id = $1)
  AND ($2 = '' OR model = $2)
  AND created_at >= $3 AND created_at < $4
GROUP BY model
ORDER BY model
