-- The journal rows holding live Idempotency-Keys among (tenant, key)
-- pairs (a key lives 24 h, as in idempotency_keys), read by a group commit
-- under the keys' advisory locks: a second admission with a key is a
-- replay of the first.
SELECT la.tenant_id, la.idem_key, la.admission_id, la.admission
FROM lease_admissions la
JOIN unnest($1::text[], $2::text[]) AS k (tenant_id, key) ON la.tenant_id = k.tenant_id AND la.idem_key = k.key
WHERE la.created_at > coalesce($3::timestamptz, clock_timestamp()) - interval '24 hours'
ORDER BY la.created_at
