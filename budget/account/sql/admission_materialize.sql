-- The admissions a batch names (by id, $1, or by a tenant's live
-- Idempotency-Key, $2 and $3) that live in a groups-shape journal's group
-- rows (00039) and have no admissions row yet, copied into admissions, so
-- that the exact path settles, releases or replays them as any other
-- (docs/leasing.md, "The compact journal", item 4). The caller holds the
-- rows of the tenants $5 (an admission of another tenant is not copied)
-- and, since admission_group_lock.sql, the admissions' state rows.
--
-- One still open is copied reserved and marked ended in its state row by
-- the exact path (ended_by 0), so that its journal no longer ends it (an
-- end there is answered not open, and settled exactly). One its journal
-- ended is copied as it ended (settled, with the actuals of the ending
-- group's row); its state row does not change. Either keeps its events'
-- seqs (lease_seq, lease_end_seq) and names its group (lease_group): the
-- booking reads its events in the group rows, never from the copy.
WITH c AS (
    SELECT id FROM unnest($1::text[]) AS id
    UNION
    SELECT k.admission_id
    FROM unnest($2::text[], $3::text[]) AS q (tenant_id, key)
    CROSS JOIN LATERAL (
        SELECT k.admission_id FROM idempotency_keys k
        WHERE k.tenant_id = q.tenant_id AND k.key = q.key
          AND k.created_at > coalesce($4::timestamptz, clock_timestamp()) - interval '24 hours'
        LIMIT 1
    ) k
), x AS MATERIALIZED (
    SELECT c.id, g.seq, p.pos, g.created_at, g.tenant_ids[p.pos] AS tenant_id, g.lease_ids[p.pos] AS lease_id,
           g.models[p.pos] AS model, g.input[p.pos] AS input, g.output[p.pos] AS output, g.cost[p.pos] AS cost,
           g.approximate[p.pos] AS approximate, g.input_weight[p.pos] AS input_weight, g.output_weight[p.pos] AS output_weight,
           g.expires_at[p.pos] AS expires_at, g.families[p.pos] AS family, g.price_models[p.pos] AS price_model,
           g.price_from[p.pos] AS price_from, g.money_estimate[p.pos] AS money_estimate, g.faces[p.pos] AS face,
           g.price_tiers[p.pos] AS price_tier, g.actors[p.pos] AS actor,
           s.ended_by[array_position(s.ended, p.pos)] AS ended_by
    FROM c
    CROSS JOIN LATERAL admission_group(c.id) AS ag
    CROSS JOIN LATERAL (SELECT * FROM lease_groups g WHERE g.holder = ag.holder AND g.count = ag.count AND c.id = ANY (g.ids) LIMIT 1) g
    CROSS JOIN LATERAL (SELECT array_position(g.ids, c.id) AS pos) p
    CROSS JOIN LATERAL (SELECT * FROM lease_group_states s WHERE s.seq = g.seq OFFSET 0) s
    WHERE g.tenant_ids[p.pos] = ANY ($5::text[]) AND NOT EXISTS (SELECT 1 FROM admissions a WHERE a.id = c.id)
), e AS (
    -- The ends the journal made: the ending group's row, where the end is.
    SELECT x.id, eg.seq * 2048 + 1024 + j.j AS end_seq, eg.created_at AS ended_at, eg.end_input[j.j] AS actual_input,
           eg.end_output[j.j] AS actual_output, eg.end_cost[j.j] AS actual_cost, eg.end_money[j.j] AS money_actual,
           eg.end_refund[j.j] AS refund
    FROM x
    CROSS JOIN LATERAL (SELECT * FROM lease_groups eg WHERE eg.seq = x.ended_by OFFSET 0) eg
    CROSS JOIN LATERAL (SELECT array_position(eg.end_ids, x.id) AS j) j
    WHERE x.ended_by > 0
), opened AS (
    UPDATE lease_group_states s
    SET ended = s.ended || (SELECT array_agg(x.pos) FROM x WHERE x.seq = s.seq AND x.ended_by IS NULL),
        ended_by = s.ended_by || array_fill(0::bigint, ARRAY[(SELECT count(*)::integer FROM x WHERE x.seq = s.seq AND x.ended_by IS NULL)])
    WHERE s.seq = ANY (ARRAY(SELECT seq FROM x WHERE ended_by IS NULL))
)
INSERT INTO admissions (
    id, tenant_id, state, model, input_tokens, output_tokens, cost, approximate, input_weight_micro, output_weight_micro,
    created_at, expires_at, family, price_model, price_from, money_estimate, face, price_tier, lease_id, lease_seq,
    lease_actor, lease_group, actual_input, actual_output, actual_cost, money_actual, ended_at, late, end_delta_micro,
    lease_end_seq
)
SELECT x.id, x.tenant_id, CASE WHEN e.id IS NULL THEN 'reserved' ELSE 'settled' END, x.model, x.input, x.output,
       x.cost, x.approximate, x.input_weight, x.output_weight, x.created_at, x.expires_at, nullif(x.family, ''),
       nullif(x.price_model, ''), x.price_from, x.money_estimate, x.face, nullif(x.price_tier, ''), x.lease_id,
       x.seq * 2048 + x.pos, nullif(x.actor, ''), x.seq, e.actual_input, e.actual_output, e.actual_cost, e.money_actual,
       e.ended_at, false, e.refund, e.end_seq
FROM x
LEFT JOIN e ON e.id = x.id
WHERE x.ended_by IS NULL OR e.id IS NOT NULL
