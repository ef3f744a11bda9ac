-- The shares of the pools just locked (written only under their lock), with
-- the same arguments as pool_lock.sql.
SELECT pool_id, tenant_id, weight, vtc_micro, served, active_at
FROM pool_shares
WHERE pool_id = ANY($1::text[])
   OR pool_id IN (SELECT pool_id FROM admissions WHERE id = ANY($2::text[]) AND pool_id IS NOT NULL)
   OR pool_id IN (SELECT a.pool_id
                  FROM idempotency_keys k
                  JOIN unnest($3::text[], $4::text[]) AS q (tenant_id, key) ON k.tenant_id = q.tenant_id AND k.key = q.key
                  JOIN admissions a ON a.id = k.admission_id
                  WHERE a.pool_id IS NOT NULL)
