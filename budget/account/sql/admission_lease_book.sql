-- A lease's events whose ledger entries are still to write, up to $2 of
-- them (NULL: all) in the lease's order, and the lease's booking cursor
-- moved past them, in one statement. An event is an admission made from
-- the lease (lease_seq) or the end of one in the lease's journal
-- (lease_end_seq, 00036), or either in a group row (00039: the event's
-- seq is the group's times 2048 plus its index); all are drawn from one
-- sequence under the
-- journal group's lock of the lease row, so the order is the order they
-- committed in, and an end always follows its admission. The caller holds
-- the row locks of the lease's tree, so no other booking of the lease
-- runs; an event of a group commit in flight is not seen, and since a
-- lease's events commit in order, it is above the cursor and booked by
-- the next booking.
WITH cursor AS (
    SELECT coalesce((SELECT booked_seq FROM admission_lease_books WHERE lease_id = $1), 0) AS seq
), l AS MATERIALIZED (
    SELECT holder, tenant_id, group_from FROM leases WHERE id = $1
), todo AS MATERIALIZED (
    -- Each kind of event read down its own index in order, each stopped at
    -- $2 (the first $2 of the lease's order are among them), the cursor a
    -- parameter of its index condition.
    SELECT * FROM (
        (SELECT a.id, a.tenant_id, a.model, a.cost, a.money_estimate, a.created_at, coalesce(a.lease_actor, '') AS actor,
                a.lease_seq AS seq, false AS ended, NULL::bigint AS actual_cost, NULL::bigint AS money_actual
         FROM admissions a
         WHERE a.lease_id = $1 AND a.lease_seq > (SELECT seq FROM cursor) AND a.lease_group IS NULL
         ORDER BY a.lease_seq
         LIMIT $2)
        UNION ALL
        (SELECT a.id, a.tenant_id, a.model, a.cost, a.money_estimate, a.ended_at, coalesce(a.lease_actor, ''),
                a.lease_end_seq, true, a.actual_cost, a.money_actual
         FROM admissions a
         WHERE a.lease_id = $1 AND a.lease_end_seq > (SELECT seq FROM cursor) AND a.lease_group IS NULL
         ORDER BY a.lease_end_seq
         LIMIT $2)
        UNION ALL
        -- A lease of a replica whose journal writes groups (00039): its
        -- events in its group rows (g), each read at the places its lease
        -- holds (array_positions, one pass in C over the lease ids): an
        -- unnest of every array made a row of every admission of the
        -- group, the other leases' too, 83 us a 64-admission row against
        -- 7 (BENCHMARKS.md, "Quota leasing, fifteenth step"). (An admission copied into
        -- admissions, lease_group set, is booked here, never from its
        -- copy.)
        (SELECT x.*
         FROM l
         CROSS JOIN (
             -- The rows its journal recorded ($3 holders, $4 counts: the
             -- groups its ids name), each looked up down
             -- lease_groups_group_idx (budget/lease, hints.go)...
             SELECT g.* FROM (SELECT DISTINCT holder, count FROM unnest($3::bigint[], $4::integer[]) AS h (holder, count)) h
             CROSS JOIN LATERAL (SELECT * FROM lease_groups g WHERE g.holder = h.holder AND g.count = h.count OFFSET 0) g
             UNION ALL
             -- ... or, with none recorded (NULL), its holder's groups since
             -- it was taken and from the cursor's, those without the lease
             -- skipped before their arrays are read through.
             SELECT g.* FROM l JOIN lease_groups g ON g.replica = l.holder
             WHERE $3::bigint[] IS NULL AND g.seq > l.group_from AND g.seq >= (SELECT seq FROM cursor) / 2048
               AND ($1 = ANY (g.lease_ids) OR $1 = ANY (g.end_leases))
         ) g
         CROSS JOIN LATERAL (
             SELECT g.ids[i], g.tenant_ids[i], g.models[i], g.cost[i], g.money_estimate[i], g.created_at, g.actors[i],
                    g.seq * 2048 + i AS seq, false AS ended, NULL::bigint AS actual_cost, NULL::bigint AS money_actual
             FROM unnest(array_positions(g.lease_ids, $1)) AS i
             UNION ALL
             SELECT g.end_ids[j], l.tenant_id, g.end_models[j], g.end_estimates[j], g.end_money_estimates[j], g.created_at,
                    g.end_actors[j], g.seq * 2048 + 1024 + j, true, g.end_cost[j], g.end_money[j]
             FROM unnest(array_positions(g.end_leases, $1)) AS j
         ) x
         WHERE x.seq > (SELECT seq FROM cursor)
         ORDER BY x.seq
         LIMIT $2)
    ) e
    ORDER BY seq
    LIMIT $2
), moved AS (
    INSERT INTO admission_lease_books (lease_id, booked_seq)
    SELECT $1, max(seq) FROM todo HAVING count(*) > 0
    ON CONFLICT (lease_id) DO UPDATE SET booked_seq = excluded.booked_seq
)
SELECT id, tenant_id, model, cost, money_estimate, created_at, actor, seq, ended, actual_cost, money_actual FROM todo ORDER BY seq
