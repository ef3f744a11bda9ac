-- The events of invariant rules for a tenant whose balance or chain the
-- ledger watch found wrong: one per rule and finding (entry and problem),
-- however many replicas' watches find it, and however often.
INSERT INTO alert_events (id, rule_id, endpoint_id, tenant_id, type, dedupe, payload)
SELECT 'evt_' || replace(gen_random_uuid()::text, '-', ''), r.id, r.endpoint_id, $1::text, 'ledger.invariant_violated',
       'invariant:' || $2::bigint || ':' || md5($3::text),
       jsonb_build_object('tenant', $1::text, 'entry', $2::bigint, 'problem', $3::text, 'rule', r.id, 'at', clock_timestamp())
FROM alert_rules r
JOIN alert_endpoints e ON e.id = r.endpoint_id AND e.disabled_at IS NULL
WHERE r.kind = 'invariant' AND r.deleted_at IS NULL AND (r.tenant_id = $1 OR r.tenant_id IS NULL)
ON CONFLICT (rule_id, dedupe) DO NOTHING
