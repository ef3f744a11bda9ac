-- +goose Up
-- The first part of settling a leased admission inside its replica's
-- journal group (docs/leasing.md, "Not built yet", item 5): the place of
-- its end in its lease's order. A journal group that ends an admission of
-- a lease it holds (state settled, the refund taken off the lease's use)
-- draws lease_end_seq from admissions_lease_seq under the group's lock of
-- the lease row, as it draws lease_seq for an admission, so that a lease's
-- events (admissions and ends) commit in one order. The lease's booking
-- (admission_lease_book.sql) then writes them in that order from its one
-- cursor: a reserve entry for an admission, a settle entry for an end,
-- which always follows its admission's. Nothing writes the column yet; the
-- booking reads it, and the index finds a lease's ends above its cursor.
ALTER TABLE admissions ADD COLUMN lease_end_seq bigint;
CREATE INDEX admissions_lease_end_idx ON admissions (lease_id, lease_end_seq) WHERE lease_end_seq IS NOT NULL;

-- +goose Down
DROP INDEX admissions_lease_end_idx;
ALTER TABLE admissions DROP COLUMN lease_end_seq;
