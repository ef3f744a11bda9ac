-- A lease's admissions whose ledger entries are still to write, up to $2
-- of them (NULL: all) in lease_seq order, and the lease's booking cursor
-- moved past them, in one statement. The caller holds the row locks of the
-- lease's tree, so no other booking of the lease runs; an admission of a
-- group commit in flight is not seen, and since a lease's admissions
-- commit in lease_seq order (admission_insert_leased.sql), it is above the
-- cursor and booked by the next booking.
WITH cursor AS (
    SELECT coalesce((SELECT booked_seq FROM admission_lease_books WHERE lease_id = $1), 0) AS seq
), todo AS MATERIALIZED (
    SELECT a.id, a.tenant_id, a.model, a.cost, a.money_estimate, a.created_at, coalesce(a.lease_actor, '') AS actor, a.lease_seq
    FROM admissions a, cursor
    WHERE a.lease_id = $1 AND a.lease_seq > cursor.seq
    ORDER BY a.lease_seq
    LIMIT $2
), moved AS (
    INSERT INTO admission_lease_books (lease_id, booked_seq)
    SELECT $1, max(lease_seq) FROM todo HAVING count(*) > 0
    ON CONFLICT (lease_id) DO UPDATE SET booked_seq = excluded.booked_seq
)
SELECT id, tenant_id, model, cost, money_estimate, created_at, actor, lease_seq FROM todo ORDER BY lease_seq
