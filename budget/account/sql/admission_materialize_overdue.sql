-- The sweeper's part of a groups-shape journal (00039): up to $1 group
-- rows whose earliest open expiry has passed by the store's clock ($2, a
-- frozen clock, or none; computed once, so lease_group_states_open_idx
-- bounds the read), their state rows locked (those another sweep or a
-- decision holds are skipped). Each overdue admission still open in them
-- is copied into admissions, reserved, as admission_materialize.sql copies
-- one, and marked ended by the sweeper (ended_by -1); the sweep then
-- expires it as any overdue reservation (admission_expired_lock.sql, once
-- its lease's booking has passed it). open_until moves to the earliest
-- expiry still open, NULL when none. Returns how many group rows it read.
WITH c AS (
    SELECT coalesce($2::timestamptz, clock_timestamp()) AS at
), due AS MATERIALIZED (
    SELECT s.seq, s.ended
    FROM lease_group_states s
    WHERE s.open_until <= (SELECT at FROM c)
    ORDER BY s.open_until
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), x AS MATERIALIZED (
    SELECT d.seq, i AS pos, g.expires_at[i] <= c.at AS overdue, g.created_at, g.ids[i] AS id, g.tenant_ids[i] AS tenant_id,
           g.lease_ids[i] AS lease_id, g.models[i] AS model, g.input[i] AS input, g.output[i] AS output, g.cost[i] AS cost,
           g.approximate[i] AS approximate, g.input_weight[i] AS input_weight, g.output_weight[i] AS output_weight,
           g.expires_at[i] AS expires_at, g.families[i] AS family, g.price_models[i] AS price_model,
           g.price_from[i] AS price_from, g.money_estimate[i] AS money_estimate, g.faces[i] AS face,
           g.price_tiers[i] AS price_tier, g.actors[i] AS actor
    FROM due d
    CROSS JOIN LATERAL (SELECT * FROM lease_groups g WHERE g.seq = d.seq OFFSET 0) g
    CROSS JOIN LATERAL generate_subscripts(g.ids, 1) AS i
    CROSS JOIN c
    WHERE i <> ALL (d.ended)
), copied AS (
    INSERT INTO admissions (
        id, tenant_id, state, model, input_tokens, output_tokens, cost, approximate, input_weight_micro, output_weight_micro,
        created_at, expires_at, family, price_model, price_from, money_estimate, face, price_tier, lease_id, lease_seq,
        lease_actor, lease_group
    )
    SELECT x.id, x.tenant_id, 'reserved', x.model, x.input, x.output, x.cost, x.approximate, x.input_weight,
           x.output_weight, x.created_at, x.expires_at, nullif(x.family, ''), nullif(x.price_model, ''), x.price_from,
           x.money_estimate, x.face, nullif(x.price_tier, ''), x.lease_id, x.seq * 2048 + x.pos, nullif(x.actor, ''), x.seq
    FROM x
    WHERE x.overdue AND NOT EXISTS (SELECT 1 FROM admissions a WHERE a.id = x.id)
), marked AS (
    -- Down the primary key (= ANY of an InitPlan's array): a join with
    -- due may be planned as a scan of every state row.
    UPDATE lease_group_states s
    SET ended = s.ended || coalesce((SELECT array_agg(x.pos) FROM x WHERE x.seq = s.seq AND x.overdue), '{}'),
        ended_by = s.ended_by || array_fill((-1)::bigint, ARRAY[(SELECT count(*)::integer FROM x WHERE x.seq = s.seq AND x.overdue)]),
        open_until = (SELECT min(x.expires_at) FROM x WHERE x.seq = s.seq AND NOT x.overdue)
    WHERE s.seq = ANY (ARRAY(SELECT seq FROM due))
)
SELECT count(*)::integer FROM due
