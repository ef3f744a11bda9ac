-- The ends a lease journal group makes (budget/lease, Journal.End), in one
-- statement: each admission named ($1) of its lease ($2), still reserved
-- and unexpired by the store's clock ($8, a frozen clock, or none), is
-- settled at its actual usage and cost ($3-$5) and money ($6, NULL with no
-- price); its refund ($7, micro-tokens) went back into the lease
-- (end_delta_micro: the tenant's again, in its lease until the return),
-- so its tenants' balances do not move now, and its settle entries, which
-- move nothing, are written by the lease's booking
-- (admission_lease_book.sql). Its place in the lease's order
-- (lease_end_seq) is drawn from the sequence its admission's was, under
-- the group's lock of the lease row.
--
-- The group's lease use took every refund off its lease's use; one whose
-- admission is not ended (another face's end came first, it expired, it
-- is not of that lease) is added back here. $9: the group was sent in one
-- round trip, so every one must end, or the guard (00035) stops the group
-- and the journal writes it the careful way, which answers each one that
-- did not end as not open (the caller settles it exactly).
WITH u AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[])
        AS u (id, lease_id, actual_input, actual_output, actual_cost, money_actual, refund_micro)
), c AS (
    SELECT coalesce($8::timestamptz, clock_timestamp()) AS at
), ended AS (
    UPDATE admissions a
    SET state = 'settled', actual_input = u.actual_input, actual_output = u.actual_output,
        actual_cost = u.actual_cost, money_actual = u.money_actual, ended_at = c.at, late = false,
        end_delta_micro = u.refund_micro, lease_end_seq = nextval('admissions_lease_seq')
    FROM u, c
    -- Found by id (admissions_pkey) alone: "state = 'reserved'" written
    -- as is lets the planner read admissions_open_expiry_idx, which holds
    -- every open reservation, and a generic plan made while few were open
    -- did, and kept doing so with 50,000 (TestJournalEndsReadByID). As an
    -- IS TRUE test it proves nothing of the partial index's predicate.
    WHERE a.id = u.id AND a.lease_id = u.lease_id AND (a.state = 'reserved') IS TRUE AND a.expires_at > c.at
    RETURNING a.id
), back AS (
    UPDATE leases l SET used_micro = l.used_micro + b.refund
    FROM (SELECT u.lease_id, sum(u.refund_micro) AS refund FROM u
          WHERE u.id NOT IN (SELECT id FROM ended) GROUP BY u.lease_id) b
    WHERE l.id = b.lease_id
)
SELECT id FROM ended
UNION ALL
SELECT NULL
WHERE NOT lease_journal_guard(NOT $9::boolean OR (SELECT count(*) FROM ended) = coalesce(cardinality($1::text[]), 0),
                              'an admission to end is not open in its lease')
