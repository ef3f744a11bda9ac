-- The events of throttled rules: a tenant whose limit (or any limit)
-- refused in each of the last sustain_minutes complete minutes before $1,
-- by the tallies every replica flushes to rejection_counts. One event per
-- episode (a run of throttled minutes, named by its first minute), however
-- many replicas evaluate it.
WITH m AS (
    SELECT r.id AS rule_id, r.endpoint_id, r.sustain_minutes, coalesce(r.limit_name, '') AS lim,
           c.tenant_id, c.minute, sum(c.count) AS refused
    FROM alert_rules r
    JOIN alert_endpoints e ON e.id = r.endpoint_id AND e.disabled_at IS NULL
    JOIN rejection_counts c ON (c.tenant_id = r.tenant_id OR r.tenant_id IS NULL) AND NOT c.shadow
         AND (r.limit_name IS NULL OR c.limit_name = r.limit_name)
         AND c.minute >= date_trunc('minute', coalesce($1::timestamptz, clock_timestamp())) - interval '1 day'
         AND c.minute < date_trunc('minute', coalesce($1::timestamptz, clock_timestamp()))
    WHERE r.kind = 'throttled' AND r.deleted_at IS NULL
    GROUP BY 1, 2, 3, 4, 5, 6
), runs AS (
    SELECT rule_id, endpoint_id, sustain_minutes, lim, tenant_id,
           min(minute) AS began, max(minute) AS last, count(*) AS minutes, sum(refused) AS refused
    FROM (SELECT *, minute - (row_number() OVER (PARTITION BY rule_id, tenant_id ORDER BY minute)) * interval '1 minute' AS grp FROM m) s
    GROUP BY rule_id, endpoint_id, sustain_minutes, lim, tenant_id, grp
)
INSERT INTO alert_events (id, rule_id, endpoint_id, tenant_id, type, dedupe, payload)
SELECT 'evt_' || replace(gen_random_uuid()::text, '-', ''), rule_id, endpoint_id, tenant_id, 'tenant.throttled',
       'throttled:' || lim || ':' || to_char(began AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI"Z"'),
       jsonb_build_object('tenant', tenant_id, 'limit', nullif(lim, ''), 'since', began, 'minutes', minutes,
                          'refused', refused, 'sustain_minutes', sustain_minutes, 'rule', rule_id)
FROM runs
WHERE last = date_trunc('minute', coalesce($1::timestamptz, clock_timestamp())) - interval '1 minute' AND minutes >= sustain_minutes
ON CONFLICT (rule_id, dedupe) DO NOTHING
