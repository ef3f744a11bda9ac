-- +goose Up
-- The lease journal made lighter to write (docs/leasing.md, "What a
-- leased admission costs"): a journal row lives only until its lease is
-- booked, and then its admissions row, its Idempotency-Key row and its
-- ledger entries say everything it said.
--
-- - Booking deletes the rows it books (DELETE ... RETURNING) instead of
--   marking them: one statement reads and takes them, a row in flight (not
--   committed) is left for the next booking, and the booking needs no lock
--   on the lease row, so it no longer holds the journal's group commits
--   back. So booked and its partial index go; rows already booked are
--   deleted (their admissions rows and entries exist).
-- - The foreign key to leases goes: it ran a trigger (a key-share lock of
--   the lease) per inserted row, where the group's own update of the lease
--   row has locked it already and refuses a lease that is not live.
-- - The foreign key of leases.tenant_id goes too. A lease row is taken
--   under its tenant's row lock (the tenant exists), and tenants are never
--   deleted; but the key's trigger runs on every update of a row version
--   the same transaction wrote, and a group commit updates its lease twice
--   when it cuts back the cost of a replay: that check took a key-share
--   lock on the tenant row, which an exact decision holds while it waits
--   for the group's Idempotency-Key lock (a deadlock).
-- - admission becomes json: the group commit writes it and the booking
--   reads it back whole, never inside Postgres, so jsonb's conversion on
--   every insert bought nothing.
DELETE FROM lease_admissions WHERE booked;
DROP INDEX lease_admissions_unbooked_idx;
ALTER TABLE lease_admissions DROP COLUMN booked;
ALTER TABLE lease_admissions DROP CONSTRAINT lease_admissions_lease_id_fkey;
ALTER TABLE leases DROP CONSTRAINT leases_tenant_id_fkey;
ALTER TABLE lease_admissions ALTER COLUMN admission DROP DEFAULT;
ALTER TABLE lease_admissions ALTER COLUMN admission TYPE json USING admission::json;
ALTER TABLE lease_admissions ALTER COLUMN admission SET DEFAULT '{}';

-- +goose Down
ALTER TABLE leases ADD CONSTRAINT leases_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES tenants (id);
ALTER TABLE lease_admissions ALTER COLUMN admission DROP DEFAULT;
ALTER TABLE lease_admissions ALTER COLUMN admission TYPE jsonb USING admission::jsonb;
ALTER TABLE lease_admissions ALTER COLUMN admission SET DEFAULT '{}';
ALTER TABLE lease_admissions ADD CONSTRAINT lease_admissions_lease_id_fkey FOREIGN KEY (lease_id) REFERENCES leases (id);
ALTER TABLE lease_admissions ADD COLUMN booked boolean NOT NULL DEFAULT false;
CREATE INDEX lease_admissions_unbooked_idx ON lease_admissions (lease_id, seq) WHERE NOT booked;
