-- The events of every period_budget rule whose threshold this decision's
-- writes crossed: used before < pct% of the budget <= used after. Sent in
-- the deciding transaction, under the tenants' row locks; at most one per
-- rule, period and threshold (the dedupe key), whatever raced. The
-- comparison is in numeric: usage * 100 may exceed bigint.
INSERT INTO alert_events (id, rule_id, endpoint_id, tenant_id, type, dedupe, payload)
SELECT 'evt_' || replace(gen_random_uuid()::text, '-', ''), r.id, r.endpoint_id, x.tenant, 'budget.threshold_crossed',
       'period:' || to_char(x.period_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ':' || p.pct,
       jsonb_build_object('tenant', x.tenant, 'threshold_percent', p.pct, 'period_budget', x.budget,
                          'period_used', x.after, 'period_start', x.period_start, 'period_end', x.period_end,
                          'rule', r.id, 'at', clock_timestamp())
FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::timestamptz[], $6::timestamptz[])
         AS x(tenant, before, after, budget, period_start, period_end)
JOIN alert_rules r ON (r.tenant_id = x.tenant OR r.tenant_id IS NULL) AND r.kind = 'period_budget' AND r.deleted_at IS NULL
JOIN alert_endpoints e ON e.id = r.endpoint_id AND e.disabled_at IS NULL
CROSS JOIN LATERAL unnest(r.thresholds) AS p(pct)
WHERE x.before::numeric * 100 < p.pct::numeric * x.budget AND x.after::numeric * 100 >= p.pct::numeric * x.budget
ON CONFLICT (rule_id, dedupe) DO NOTHING
