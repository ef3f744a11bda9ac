-- The admission a live Idempotency-Key names.
SELECT a.*
FROM idempotency_keys k
JOIN admissions a ON a.id = k.admission_id
WHERE k.tenant_id = $1 AND k.key = $2 AND k.created_at > coalesce($3::timestamptz, clock_timestamp()) - interval '24 hours'
