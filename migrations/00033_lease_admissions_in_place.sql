-- +goose Up
-- A leased admission is written once, where it lives (docs/leasing.md,
-- "What a leased admission writes"): the journal's group commit inserts
-- its admissions row and its Idempotency-Key row, and the booking only
-- appends its chained ledger entries. The journal table goes: a journal
-- row was written by the group, then read, deleted and written again as
-- the admissions row, the key row and the entries by the booking, under
-- the tenant's row lock (BENCHMARKS.md, "Quota leasing, second step": the
-- double write was what bound).
--
-- - lease_id names the lease an admission was made from (NULL: decided
--   exactly); lease_seq orders a lease's admissions as they were journaled
--   (a group commit draws them under its lock of the lease row, held to its
--   commit, so a lease's seqs are committed in order); actor is its reserve
--   entry's actor, which the booking writes.
-- - admission_lease_books holds, per lease, the last lease_seq whose ledger
--   entries are written: a lease's admissions above it are still to book.
--   Only a booking writes it, under the tree's row locks; a group commit
--   never reads it, so the two never wait for each other.
--
-- Rows still in the old journal cannot be booked by this release: the
-- migration refuses to run until the previous release has booked them
-- (lease mode off, or every replica stopped and a lease TTL passed with one
-- replica of the previous release running its sweeper).
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM lease_admissions) THEN
        RAISE EXCEPTION 'lease journal rows are not booked yet: set every tenant''s lease mode off (or stop the replicas) and let a replica of the previous release run for one lease TTL, then migrate';
    END IF;
END
$$;
-- +goose StatementEnd
ALTER TABLE admissions
    ADD COLUMN lease_id  text,
    ADD COLUMN lease_seq bigint,
    ADD COLUMN actor     text;
CREATE SEQUENCE admissions_lease_seq AS bigint;
CREATE INDEX admissions_lease_idx ON admissions (lease_id, lease_seq) WHERE lease_id IS NOT NULL;
CREATE TABLE admission_lease_books (
    lease_id   text   PRIMARY KEY,
    booked_seq bigint NOT NULL
);
DROP TABLE lease_admissions;

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
CREATE TABLE lease_admissions (
    lease_id     text        NOT NULL,
    seq          bigint      GENERATED ALWAYS AS IDENTITY,
    admission_id text        NOT NULL UNIQUE,
    model        text        NOT NULL,
    cost         bigint      NOT NULL CHECK (cost >= 0),
    cost_micro   bigint      NOT NULL CHECK (cost_micro >= 0),
    money_micro  bigint,
    created_at   timestamptz NOT NULL,
    tenant_id    text,
    idem_key     text,
    admission    json        NOT NULL DEFAULT '{}',
    PRIMARY KEY (lease_id, seq)
);
CREATE INDEX lease_admissions_key_idx ON lease_admissions (tenant_id, idem_key) WHERE idem_key IS NOT NULL;
DROP TABLE admission_lease_books;
DROP INDEX admissions_lease_idx;
DROP SEQUENCE admissions_lease_seq;
ALTER TABLE admissions DROP COLUMN actor, DROP COLUMN lease_seq, DROP COLUMN lease_id;
