-- The events of the window thresholds this decision's writes crossed:
-- used before < pct% of the window's limit <= used after, for every
-- threshold of the tenant's period_budget rules and every threshold of the
-- window itself (a soft budget's limit among them: $9, comma-separated),
-- delivered to the rules' endpoints. Sent in the deciding transaction,
-- under the tenants' row locks; at most one per rule, window, span and
-- threshold (the dedupe key), whatever raced. The "period" window keeps the
-- key it had as the period budget. The comparison is in numeric: usage *
-- 100 may exceed bigint.
INSERT INTO alert_events (id, rule_id, endpoint_id, tenant_id, type, dedupe, payload)
SELECT 'evt_' || replace(gen_random_uuid()::text, '-', ''), r.id, r.endpoint_id, x.tenant, 'budget.threshold_crossed',
       CASE WHEN x.window_name = 'period' THEN 'period:' ELSE 'window:' || x.window_name || ':' END
           || to_char(x.period_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ':' || p.pct,
       jsonb_build_object('tenant', x.tenant, 'window', x.window_name, 'counts', x.counts,
                          'threshold_percent', p.pct, 'period_budget', x.budget,
                          'period_used', x.after, 'period_start', x.period_start, 'period_end', x.period_end,
                          'rule', r.id, 'at', clock_timestamp())
FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::timestamptz[], $6::timestamptz[],
            $7::text[], $8::text[], $9::text[])
         AS x(tenant, before, after, budget, period_start, period_end, window_name, counts, own)
JOIN alert_rules r ON (r.tenant_id = x.tenant OR r.tenant_id IS NULL) AND r.kind = 'period_budget' AND r.deleted_at IS NULL
JOIN alert_endpoints e ON e.id = r.endpoint_id AND e.disabled_at IS NULL
CROSS JOIN LATERAL (
    SELECT DISTINCT t.pct
    FROM unnest(r.thresholds || coalesce(string_to_array(nullif(x.own, ''), ',')::int[], '{}'::int[])) AS t(pct)
) AS p
WHERE x.before::numeric * 100 < p.pct::numeric * x.budget AND x.after::numeric * 100 >= p.pct::numeric * x.budget
ON CONFLICT (rule_id, dedupe) DO NOTHING
