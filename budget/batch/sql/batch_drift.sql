-- The drift of batch lines, as drift_report.sql reports admissions': the
-- lines of batches created in [$3, $4), of one tenant ($1, '' for all)
-- and one model ($2, '' for all), by tenant ('*' when $5: every tenant
-- merged) and model. Costs are the allowance's micro-units rounded up to
-- cost units; money is micro-units at the batch price.
SELECT CASE WHEN $5 THEN '*' ELSE b.tenant_id END AS tenant_id, l.model, count(*) AS admissions,
       sum(l.input_tokens::numeric) AS estimated_input_tokens, sum(l.output_tokens::numeric) AS estimated_output_tokens,
       ceil(sum(l.reserved_micro::numeric) / 1000000) AS estimated_cost,
       coalesce(sum(l.actual_input::numeric), 0) AS actual_input_tokens, coalesce(sum(l.actual_output::numeric), 0) AS actual_output_tokens,
       coalesce(ceil(sum(l.actual_micro::numeric) / 1000000), 0) AS actual_cost,
       count(*) FILTER (WHERE l.state = 'settled') AS settled,
       count(*) FILTER (WHERE l.outcome = 'expired') AS expired,
       coalesce(avg((l.reserved_micro::numeric - l.actual_micro)::float8 / greatest(l.actual_micro, 1)) FILTER (WHERE l.state = 'settled'), 0) AS mean_relative_error,
       coalesce(percentile_cont(0.95) WITHIN GROUP (ORDER BY abs((l.reserved_micro::numeric - l.actual_micro)::float8 / greatest(l.actual_micro, 1)))
                FILTER (WHERE l.state = 'settled'), 0) AS p95_abs_relative_error,
       coalesce(sum(l.reserved_micro::numeric - coalesce(l.actual_micro, 0)) FILTER (WHERE l.state <> 'enqueued' AND l.reserved_micro >= coalesce(l.actual_micro, 0)), 0) AS refunded_micro,
       coalesce(sum(l.actual_micro::numeric - l.reserved_micro) FILTER (WHERE l.actual_micro > l.reserved_micro), 0) AS extra_charged_micro,
       0::bigint AS shadow_refused,
       count(l.money_micro) AS priced,
       coalesce(sum(l.money_micro::numeric), 0) AS estimated_money_micro,
       coalesce(sum(l.actual_money_micro::numeric), 0) AS actual_money_micro,
       coalesce(sum((l.money_micro - l.actual_money_micro)::numeric) FILTER (WHERE l.state = 'settled'), 0) AS money_drift_micro
FROM batch_lines l JOIN batches b ON b.id = l.batch_id
WHERE ($1 = '' OR b.tenant_id = $1)
  AND ($2 = '' OR l.model = $2)
  AND b.created_at >= $3 AND b.created_at < $4
GROUP BY 1, l.model
ORDER BY 1, l.model
