-- The live Idempotency-Keys among a batch's (tenant, key) pairs.
SELECT i.tenant_id, i.key, i.admission_id, i.request_hash, i.response
FROM idempotency_keys i
JOIN unnest($1::text[], $2::text[]) AS k (tenant_id, key) ON i.tenant_id = k.tenant_id AND i.key = k.key
WHERE i.created_at > coalesce($3::timestamptz, clock_timestamp()) - interval '24 hours'
