-- +goose Up
-- Settling a leased admission inside its replica's journal group
-- (docs/leasing.md, "Not built yet", item 5): the place of its end in its
-- lease's order. A journal group that ends an admission of a lease its
-- replica holds (state settled, the refund back in the lease) draws
-- lease_end_seq from admissions_lease_seq under the group's lock of the
-- lease row, as it draws lease_seq for an admission, so that a lease's
-- events (admissions and ends) commit in one order. The lease's booking
-- (admission_lease_book.sql) writes them in that order from its one
-- cursor: a reserve entry for an admission, a settle entry for an end,
-- which always follows its admission's. The index finds a lease's ends
-- above its cursor.
--
-- The previous release's booking does not know the ends, and would move a
-- lease's cursor past them without their settle entries, so leasing is off
-- across the upgrade: the migration refuses to run while a lease is live
-- (set every tenant's lease mode off first; that ends and books its leases
-- at once), and the down migration while an end is not booked.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM leases WHERE state = 'live') THEN
        RAISE EXCEPTION 'quota leasing must be off across this upgrade: set every tenant''s lease mode off (tokengate tenant update NAME --lease off, which ends and books its leases), then migrate; turn it back on once every replica runs this release';
    END IF;
END
$$;
-- +goose StatementEnd
ALTER TABLE admissions ADD COLUMN lease_end_seq bigint;
CREATE INDEX admissions_lease_end_idx ON admissions (lease_id, lease_end_seq) WHERE lease_end_seq IS NOT NULL;

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM leases WHERE state = 'live') OR EXISTS (SELECT 1 FROM admissions a WHERE a.lease_end_seq IS NOT NULL
               AND a.lease_end_seq > coalesce((SELECT b.booked_seq FROM admission_lease_books b WHERE b.lease_id = a.lease_id), 0)) THEN
        RAISE EXCEPTION 'leased admissions'' ends are not booked yet: set every tenant''s lease mode off first';
    END IF;
END
$$;
-- +goose StatementEnd
DROP INDEX admissions_lease_end_idx;
ALTER TABLE admissions DROP COLUMN lease_end_seq;
