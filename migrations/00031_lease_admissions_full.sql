-- +goose Up
-- A lease admission becomes a real admission (docs/leasing.md): its
-- journal row carries everything the admissions row and the
-- Idempotency-Key row it becomes at booking need.
--
-- admission is one JSON document (account.Admission as budget/lease
-- encodes it: the estimate's tokens and weights, family, face, price and
-- money, expiry, and the key's request hash and answer) rather than typed
-- columns: it is written once by the group commit and read once by the
-- booking, never filtered on, so the admissions table's columns can grow
-- without a migration of the journal, and the group's insert stays one
-- array per column it filters on. '{}' is a row journaled before this
-- migration: booked as before, with no admission row.
--
-- tenant_id and idem_key are typed because statements look rows up by
-- them: the exact path's load and the group commit answer a second
-- admission with the same key as a replay of the journaled one. The key
-- is unique per tenant across the journal and idempotency_keys, which the
-- group commit and the decision enforce under one advisory lock per
-- (tenant, key) (not a unique index: a key is forgotten after 24 h, as in
-- idempotency_keys, and may then name another admission).
ALTER TABLE lease_admissions
    ADD COLUMN tenant_id text,
    ADD COLUMN idem_key  text,
    ADD COLUMN admission jsonb NOT NULL DEFAULT '{}';
CREATE INDEX lease_admissions_key_idx ON lease_admissions (tenant_id, idem_key) WHERE idem_key IS NOT NULL;

-- +goose Down
DROP INDEX lease_admissions_key_idx;
ALTER TABLE lease_admissions DROP COLUMN admission, DROP COLUMN idem_key, DROP COLUMN tenant_id;
