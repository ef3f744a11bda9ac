-- The live Idempotency-Keys among a batch's (tenant, key) pairs, each
-- looked up on its own down the primary key (a LATERAL subquery with a
-- LIMIT is never flattened into a join): a join of the pairs with the
-- table was planned, from statistics taken while idempotency_keys was
-- small, as a hash join over the whole table, and the cached plan stayed
-- so as it grew (0.85 ms a batch with no key found; BENCHMARKS.md, "Quota
-- leasing, second step"). This shape has one plan, so a generic plan is
-- as good as a custom one and costs no planning.
SELECT i.tenant_id, i.key, i.admission_id, i.request_hash, i.response
FROM unnest($1::text[], $2::text[]) AS k (tenant_id, key)
CROSS JOIN LATERAL (
    SELECT i.tenant_id, i.key, i.admission_id, i.request_hash, i.response
    FROM idempotency_keys i
    WHERE i.tenant_id = k.tenant_id AND i.key = k.key
      AND i.created_at > coalesce($3::timestamptz, clock_timestamp()) - interval '24 hours'
    LIMIT 1
) i
