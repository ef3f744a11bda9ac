-- A lease journal group in the groups shape (budget/lease, 00039), in one
-- statement: its admissions as one lease_groups row with its state row,
-- their Idempotency-Key rows, and its ends of admissions of earlier groups.
-- What admission_insert_leased.sql and admission_end_leased.sql do for
-- the rows shape, with the same rules; their comments say why.
--
-- $1 replica (the leases' holder), $2 and $3 the group its ids name
-- (holder number and count; 0 for none), $4 the store's clock (a frozen
-- clock, or none). The admissions ($5-$23), in the row's order; their keys
-- ($24-$26, '' for none). The ends ($27-$33), with the group each one's id
-- names ($34, $35; rule.AdmissionGroupOf); NULL arrays for none; $36: sent in one round trip,
-- so every end must end or the guard stops the group.
--
-- The group's seq is drawn here, after the group's lease use locked its
-- leases, so a lease's groups commit in seq order (00039).
--
-- An end is made when its admission is in the group its id names, of its
-- lease, unexpired by the store's clock and not ended: marked in its
-- group's state row (one update per state row, which the other ends of the
-- row wait for and then see: an end that finds one of its row's ends made
-- since makes none of that row's, and each is answered as not open, so the
-- caller settles it exactly). Its refund, taken off its lease's use by the
-- group's lease use, is added back when it is not made.
WITH c AS MATERIALIZED (
    SELECT coalesce($4::timestamptz, clock_timestamp()) AS at, nextval('admissions_lease_seq') AS seq
), a AS (
    SELECT array_agg(coalesce(u.expires_at, c.at + coalesce(u.ttl_ms, (SELECT t.reservation_ttl_ms FROM tenants t WHERE t.id = u.tenant_id))
                                                          * interval '1 millisecond') ORDER BY u.n) AS expires_at
    FROM unnest($6::text[], $15::timestamptz[], $16::bigint[]) WITH ORDINALITY AS u (tenant_id, expires_at, ttl_ms, n)
    CROSS JOIN c
), e AS MATERIALIZED (
    -- An admission ended twice in one group is ended once.
    SELECT DISTINCT ON (u.id) u.*, g.seq AS group_seq, x.pos, g.models[x.pos] AS model, g.cost[x.pos] AS estimate,
           g.money_estimate[x.pos] AS money_estimate, g.actors[x.pos] AS actor
    FROM unnest($27::text[], $28::text[], $29::bigint[], $30::bigint[], $31::bigint[], $32::bigint[], $33::bigint[],
                $34::bigint[], $35::integer[])
         WITH ORDINALITY AS u (id, lease_id, actual_input, actual_output, actual_cost, money_actual, refund_micro, holder, count, n)
    -- Each end's group looked up on its own down lease_groups_group_idx (a
    -- join the planner may make a hash of the whole table, as a generic
    -- plan made while the table was small did: 2.7 ms a group).
    CROSS JOIN LATERAL (
        SELECT g.seq, g.ids, g.lease_ids, g.expires_at, g.models, g.cost, g.money_estimate, g.actors
        FROM lease_groups g
        WHERE g.holder = u.holder AND g.count = u.count AND u.id = ANY (g.ids)
        LIMIT 1
    ) g
    CROSS JOIN LATERAL (SELECT array_position(g.ids, u.id) AS pos) x
    CROSS JOIN c
    WHERE g.lease_ids[x.pos] = u.lease_id AND g.expires_at[x.pos] > c.at
    ORDER BY u.id, u.n
), marked AS (
    -- The state rows found down their primary key (= ANY of an InitPlan's
    -- array), each with its positions.
    UPDATE lease_group_states s
    SET ended = s.ended || (SELECT array_agg(e.pos) FROM e WHERE e.group_seq = s.seq),
        ended_by = s.ended_by || array_fill((SELECT seq FROM c), ARRAY[(SELECT count(*)::integer FROM e WHERE e.group_seq = s.seq)])
    WHERE s.seq = ANY (ARRAY(SELECT DISTINCT group_seq FROM e))
      AND NOT (s.ended && (SELECT array_agg(e.pos) FROM e WHERE e.group_seq = s.seq))
    RETURNING s.seq
), ended AS (
    SELECT e.* FROM e WHERE e.group_seq IN (SELECT seq FROM marked)
), g AS (
    INSERT INTO lease_groups (
        seq, replica, holder, count, created_at, ids, tenant_ids, lease_ids, models, input, output, cost, approximate,
        input_weight, output_weight, expires_at, families, price_models, price_from, money_estimate, faces, price_tiers,
        actors, end_ids, end_leases, end_input, end_output, end_cost, end_money, end_refund, end_models, end_estimates,
        end_money_estimates, end_actors
    )
    SELECT c.seq, $1, $2, $3, c.at, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, a.expires_at, $17, $18, $19, $20, $21,
           $22, $23, n.ids, n.leases, n.input, n.output, n.cost, n.money, n.refund, n.models, n.estimates,
           n.money_estimates, n.actors
    FROM c CROSS JOIN a CROSS JOIN (
        SELECT array_agg(id ORDER BY n) AS ids, array_agg(lease_id ORDER BY n) AS leases,
               array_agg(actual_input ORDER BY n) AS input, array_agg(actual_output ORDER BY n) AS output,
               array_agg(actual_cost ORDER BY n) AS cost, array_agg(money_actual ORDER BY n) AS money,
               array_agg(refund_micro ORDER BY n) AS refund, array_agg(model ORDER BY n) AS models,
               array_agg(estimate ORDER BY n) AS estimates, array_agg(money_estimate ORDER BY n) AS money_estimates,
               array_agg(actor ORDER BY n) AS actors
        FROM ended
    ) n
    WHERE coalesce(cardinality($5::text[]), 0) > 0 OR n.ids IS NOT NULL
), s AS (
    INSERT INTO lease_group_states (seq, open_until)
    SELECT c.seq, (SELECT min(x) FROM unnest(a.expires_at) x)
    FROM c CROSS JOIN a
    WHERE coalesce(cardinality($5::text[]), 0) > 0
), k AS (
    INSERT INTO idempotency_keys (tenant_id, key, admission_id, request_hash, response, created_at)
    SELECT u.tenant_id, u.key, u.id, u.request_hash, u.response, c.at
    FROM unnest($5::text[], $6::text[], $24::text[], $25::bytea[], $26::bytea[]) AS u (id, tenant_id, key, request_hash, response)
    CROSS JOIN c
    WHERE u.key <> ''
), back AS (
    UPDATE leases l SET used_micro = l.used_micro + b.refund
    FROM (SELECT u.lease_id, sum(u.refund_micro) AS refund
          FROM unnest($27::text[], $28::text[], $33::bigint[]) AS u (id, lease_id, refund_micro)
          WHERE u.id NOT IN (SELECT id FROM ended) GROUP BY u.lease_id) b
    WHERE l.id = b.lease_id
)
SELECT id FROM ended
UNION ALL
SELECT NULL
WHERE NOT lease_journal_guard(NOT $36::boolean OR (SELECT count(*) FROM ended) = coalesce(cardinality($27::text[]), 0),
                              'an admission to end is not open in its lease')
