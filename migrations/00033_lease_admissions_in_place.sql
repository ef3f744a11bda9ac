-- +goose Up
-- A leased admission is written once, where it lives (docs/leasing.md,
-- "What a lease is"): the journal's group commit inserts its admissions
-- row and its Idempotency-Key row, and the booking only appends its chained
-- ledger entries. A journal row (lease_admissions) was written by the
-- group, then read, deleted and written again as the admissions row, the
-- key row and the entries by the booking, under the tenant's row lock
-- (BENCHMARKS.md, "Quota leasing, second step": the double write was what
-- bound).
--
-- - lease_id names the lease an admission was made from (NULL: decided
--   exactly); lease_seq orders a lease's admissions as they were journaled
--   (a group commit draws them under its lock of the lease row, held to its
--   commit, so a lease's seqs are committed in order); lease_actor is its
--   reserve entry's actor, which the booking writes (named for its subject:
--   ledger_entries has an actor).
-- - admission_lease_books holds, per lease, the last lease_seq whose ledger
--   entries are written: a lease's admissions above it are still to book.
--   Only a booking writes it, under the tree's row locks; a group commit
--   never reads it, so the two never wait for each other.
--
-- The old journal is left in place, empty and unused by this release: the
-- previous release's settles read it (for tenants with a live lease), so it
-- is dropped by a later release, once no replica of the previous one can
-- serve (docs/operators.md, "Upgrades"). Its rows cannot be booked by this
-- release, and the previous release cannot book this one's, so leasing is
-- off across the upgrade: the migration refuses to run while a lease is
-- live or a journal row is unbooked (set every tenant's lease mode off
-- first; that ends and books its leases at once).
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM leases WHERE state = 'live') OR EXISTS (SELECT 1 FROM lease_admissions) THEN
        RAISE EXCEPTION 'quota leasing must be off across this upgrade: set every tenant''s lease mode off (tokengate tenant update NAME --lease off, which ends and books its leases), then migrate; turn it back on once every replica runs this release';
    END IF;
END
$$;
-- +goose StatementEnd
ALTER TABLE admissions
    ADD COLUMN lease_id    text,
    ADD COLUMN lease_seq   bigint,
    ADD COLUMN lease_actor text;
CREATE SEQUENCE admissions_lease_seq AS bigint;
CREATE INDEX admissions_lease_idx ON admissions (lease_id, lease_seq) WHERE lease_id IS NOT NULL;
CREATE TABLE admission_lease_books (
    lease_id   text   PRIMARY KEY,
    booked_seq bigint NOT NULL
);

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM admissions a WHERE a.lease_id IS NOT NULL
               AND a.lease_seq > coalesce((SELECT b.booked_seq FROM admission_lease_books b WHERE b.lease_id = a.lease_id), 0)) THEN
        RAISE EXCEPTION 'leased admissions are not booked yet: set every tenant''s lease mode off first';
    END IF;
END
$$;
-- +goose StatementEnd
DROP TABLE admission_lease_books;
DROP INDEX admissions_lease_idx;
DROP SEQUENCE admissions_lease_seq;
ALTER TABLE admissions DROP COLUMN lease_actor, DROP COLUMN lease_seq, DROP COLUMN lease_id;
