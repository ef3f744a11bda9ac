-- A groups-shape lease's booking from the events its journal kept
-- (budget/lease, kept.go; account.BookLeasedEvents): the lease's booking
-- cursor, as it was, and moved to $2 (the last kept event's seq) when
-- that is above it. The caller holds the row locks of the lease's tree,
-- so no other booking of the lease runs; it books the kept events above
-- the cursor returned. (The events below it were booked by the exact
-- path's booking, admission_lease_book_named.sql, from the group rows.)
WITH cursor AS (
    SELECT coalesce((SELECT booked_seq FROM admission_lease_books WHERE lease_id = $1), 0) AS seq
), moved AS (
    INSERT INTO admission_lease_books (lease_id, booked_seq)
    SELECT $1, $2::bigint FROM cursor WHERE $2::bigint > cursor.seq
    ON CONFLICT (lease_id) DO UPDATE SET booked_seq = excluded.booked_seq
)
SELECT seq FROM cursor
