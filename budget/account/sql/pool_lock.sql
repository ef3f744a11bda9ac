-- The pools of a batch, locked after its tenants and admissions (the one
-- global lock order: tenants, admissions, pools), in id order: those the
-- reserves' models route to ($1), and those the ended admissions drew on,
-- named by id ($2) or by a tenant's Idempotency-Key ($3, $4: the (tenant,
-- key) pairs; a pool locked for a key past its 24 h is merely unused).
SELECT id, tokens_capacity, tokens_rate_micro, tokens_micro, tokens_at, created_at
FROM pools
WHERE id = ANY($1::text[])
   OR id IN (SELECT pool_id FROM admissions WHERE id = ANY($2::text[]) AND pool_id IS NOT NULL)
   OR id IN (SELECT a.pool_id
             FROM idempotency_keys k
             JOIN unnest($3::text[], $4::text[]) AS q (tenant_id, key) ON k.tenant_id = q.tenant_id AND k.key = q.key
             JOIN admissions a ON a.id = k.admission_id
             WHERE a.pool_id IS NOT NULL)
ORDER BY id
FOR UPDATE
