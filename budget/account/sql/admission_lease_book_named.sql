-- The leased events to book before a batch ends the admissions it names
-- (by id, $1, or by a tenant's live Idempotency-Key, $2 and $3, as
-- admission_lock.sql, which runs just before this in the same round trip):
-- for each lease of a named admission whose entries are still to write,
-- the lease's events (its admissions, and the ends its journal made,
-- 00036) above its booking cursor up to the last admission named (the ones
-- after it are left to the lease's next booking), in the lease's order,
-- with the cursor moved past them (admission_lease_book.sql). A lease's
-- events commit in that order, so every one up to a named one is
-- committed. The batch holds the tenant rows of the leases' trees,
-- so no other booking of them runs; the batch writes their entries before
-- its own. Each key is looked up on its own down the primary key
-- (idempotency_get.sql says why), and each lease's range is bounded on
-- both sides, so that its read stays a scan of the lease's index: open
-- above, it was planned (generically, a renewed lease naming most of a hot
-- tenant's rows) as a scan of all admissions, in every settle
-- (BENCHMARKS.md, "Quota leasing, third step").
WITH named AS (
    SELECT k.admission_id
    FROM unnest($2::text[], $3::text[]) AS q (tenant_id, key)
    CROSS JOIN LATERAL (
        SELECT k.key, k.admission_id FROM idempotency_keys k
        WHERE k.tenant_id = q.tenant_id AND k.key = q.key
          AND k.created_at > coalesce($4::timestamptz, clock_timestamp()) - interval '24 hours'
        LIMIT 1
    ) k
), cursors AS MATERIALIZED (
    SELECT a.lease_id, c.seq, max(a.lease_seq) AS upto
    FROM admissions a
    CROSS JOIN LATERAL (SELECT coalesce((SELECT b.booked_seq FROM admission_lease_books b WHERE b.lease_id = a.lease_id), 0) AS seq) c
    WHERE a.id = ANY ($1::text[] || ARRAY(SELECT admission_id FROM named))
      AND a.lease_id IS NOT NULL AND a.lease_seq > c.seq
    GROUP BY a.lease_id, c.seq
), todo AS MATERIALIZED (
    SELECT a.lease_id, a.id, a.tenant_id, a.model, a.cost, a.money_estimate, a.created_at,
           coalesce(a.lease_actor, '') AS actor, a.lease_seq AS seq, false AS ended,
           NULL::bigint AS actual_cost, NULL::bigint AS money_actual
    FROM cursors c
    JOIN admissions a ON a.lease_id = c.lease_id AND a.lease_seq > c.seq AND a.lease_seq <= c.upto
    WHERE a.lease_group IS NULL
    UNION ALL
    -- The events of a groups-shape journal's leases (00039), in their
    -- holder's groups in the range, read at their places
    -- (admission_lease_book.sql).
    SELECT c.lease_id, x.*
    FROM cursors c
    JOIN leases l ON l.id = c.lease_id
    JOIN lease_groups g ON g.replica = l.holder AND g.seq > l.group_from AND g.seq >= c.seq / 2048 AND g.seq <= c.upto / 2048
    CROSS JOIN LATERAL (
        SELECT g.ids[i], g.tenant_ids[i], g.models[i], g.cost[i], g.money_estimate[i], g.created_at, g.actors[i],
               g.seq * 2048 + i AS seq, false AS ended, NULL::bigint AS actual_cost, NULL::bigint AS money_actual
        FROM unnest(array_positions(g.lease_ids, c.lease_id)) AS i
        UNION ALL
        SELECT g.end_ids[j], l.tenant_id, g.end_models[j], g.end_estimates[j], g.end_money_estimates[j], g.created_at,
               g.end_actors[j], g.seq * 2048 + 1024 + j, true, g.end_cost[j], g.end_money[j]
        FROM unnest(array_positions(g.end_leases, c.lease_id)) AS j
    ) x
    WHERE (c.lease_id = ANY (g.lease_ids) OR c.lease_id = ANY (g.end_leases)) AND x.seq > c.seq AND x.seq <= c.upto
    UNION ALL
    -- The ends, each lease's range read down admissions_lease_end_idx with
    -- the lease and its bounds as parameters (OFFSET 0 keeps the subquery
    -- from being flattened into a join the planner may cost otherwise).
    SELECT e.*
    FROM cursors c
    CROSS JOIN LATERAL (
        SELECT a.lease_id, a.id, a.tenant_id, a.model, a.cost, a.money_estimate, a.ended_at,
               coalesce(a.lease_actor, ''), a.lease_end_seq, true, a.actual_cost, a.money_actual
        FROM admissions a
        WHERE a.lease_id = c.lease_id AND a.lease_end_seq > c.seq AND a.lease_end_seq <= c.upto AND a.lease_group IS NULL
        OFFSET 0
    ) e
), moved AS (
    INSERT INTO admission_lease_books (lease_id, booked_seq)
    SELECT lease_id, max(seq) FROM todo GROUP BY lease_id
    ON CONFLICT (lease_id) DO UPDATE SET booked_seq = excluded.booked_seq
)
SELECT lease_id, id, tenant_id, model, cost, money_estimate, created_at, actor, seq, ended, actual_cost, money_actual
FROM todo ORDER BY lease_id, seq
