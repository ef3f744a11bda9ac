-- The admissions a batch settles or releases, locked after their tenants
-- (the lock order is always tenant rows, then admission rows), all in one
-- statement in id order: those named by id ($1), and those a tenant's live
-- Idempotency-Key names ($2, $3: the (tenant, key) pairs; a key lives 24 h,
-- as in admission_by_key.sql). The key's tenant is the admission's, whose
-- row this transaction holds: every key a batch can name is written under
-- that lock, so this read is current. named_by lists the keys that named
-- the row; each key is looked up on its own down the primary key
-- (idempotency_get.sql says why). ARRAY(...) is computed once (an InitPlan), so the primary key
-- index finds every row.
WITH named AS (
    SELECT k.key, k.admission_id
    FROM unnest($2::text[], $3::text[]) AS q (tenant_id, key)
    CROSS JOIN LATERAL (
        SELECT k.key, k.admission_id FROM idempotency_keys k
        WHERE k.tenant_id = q.tenant_id AND k.key = q.key
          AND k.created_at > coalesce($4::timestamptz, clock_timestamp()) - interval '24 hours'
        LIMIT 1
    ) k
)
SELECT a.id, a.tenant_id, a.state, a.model, a.input_tokens, a.output_tokens, a.cost, a.approximate,
       a.input_weight_micro, a.output_weight_micro, a.created_at, a.expires_at, a.ended_at, a.late,
       a.actual_input, a.actual_output, a.actual_cost, a.end_delta_micro, a.end_balance_micro, a.shadowed,
       a.family, a.model_levels, a.pool_id, a.price_model, a.price_from, a.price_tier, a.money_estimate,
       a.money_actual, a.face, a.debited_micro,
       ARRAY(SELECT n.key FROM named n WHERE n.admission_id = a.id) AS named_by
FROM admissions a
WHERE a.id = ANY ($1::text[] || ARRAY(SELECT admission_id FROM named))
ORDER BY a.id
FOR UPDATE OF a
