-- +goose Up
-- A lease's booking stores its entries as records (docs/leasing.md,
-- "The audit trail"; docs/auditors.md, "How entries are stored"). A
-- booking writes, at every level of the tree, one entry per admission and
-- per end it books; those entries share their tenant, created_at, balance,
-- delta (zero), period and windows, and differ in kind, admission, model,
-- amounts, actor, detail and hash. Each was a row of its own with four
-- B-tree entries: the most a leased admission wrote. Now a run of them is
-- one row: the row is the run's last entry, as any entry is, and carries the
-- entries before it in the chain (earlier_*, in seq order, one element
-- each), with the lease that booked them (lease_id, indexed, so that an
-- admission's entries are found from its lease).
--
-- The table is renamed ledger_rows, and ledger_entries is now a view that
-- gives every entry as a row, whatever its storage: every query of
-- ledger_entries (auditors', reports', an older replica's) reads the same
-- entries as before. row_seq, row_admission_id and row_lease_id are the
-- storing row's seq, admission and lease, for queries that page or look
-- entries up through the row's indexes. An older replica beside this
-- release inserts into the view; a trigger stores each of its entries as a
-- row of its own.
ALTER TABLE ledger_entries RENAME TO ledger_rows;
ALTER TABLE ledger_rows
    ADD COLUMN lease_id           text,
    ADD COLUMN earlier_prev       bytea,
    ADD COLUMN earlier_kinds      text[],
    ADD COLUMN earlier_admissions text[],
    ADD COLUMN earlier_models     text[],
    ADD COLUMN earlier_estimates  bigint[],
    ADD COLUMN earlier_actuals    bigint[],
    ADD COLUMN earlier_refills    bigint[],
    ADD COLUMN earlier_money      bigint[],
    ADD COLUMN earlier_actors     text[],
    ADD COLUMN earlier_reasons    text[],
    ADD COLUMN earlier_details    text[],
    ADD COLUMN earlier_hashes     bytea[],
    ADD CONSTRAINT ledger_rows_earlier_check CHECK (earlier_hashes IS NULL OR (
        lease_id IS NOT NULL AND earlier_prev IS NOT NULL AND cardinality(earlier_hashes) BETWEEN 1 AND seq - 1
        AND cardinality(earlier_kinds) = cardinality(earlier_hashes)
        AND cardinality(earlier_admissions) = cardinality(earlier_hashes)
        AND cardinality(earlier_models) = cardinality(earlier_hashes)
        AND cardinality(earlier_estimates) = cardinality(earlier_hashes)
        AND cardinality(earlier_actuals) = cardinality(earlier_hashes)
        AND cardinality(earlier_refills) = cardinality(earlier_hashes)
        AND cardinality(earlier_money) = cardinality(earlier_hashes)
        AND cardinality(earlier_actors) = cardinality(earlier_hashes)
        AND cardinality(earlier_reasons) = cardinality(earlier_hashes)
        AND cardinality(earlier_details) = cardinality(earlier_hashes)
        AND earlier_kinds <@ ARRAY['reserve', 'settle', 'release', 'expire']));
-- A record of a few hundred entries is tens of kilobytes, compressed and
-- stored out of line: lz4 costs Postgres a third less CPU per entry than
-- the default pglz (make bench-pgcost), where the server has it.
-- +goose StatementBegin
DO $$
BEGIN
    ALTER TABLE ledger_rows ALTER COLUMN earlier_kinds SET COMPRESSION lz4,
        ALTER COLUMN earlier_admissions SET COMPRESSION lz4, ALTER COLUMN earlier_models SET COMPRESSION lz4,
        ALTER COLUMN earlier_estimates SET COMPRESSION lz4, ALTER COLUMN earlier_actuals SET COMPRESSION lz4,
        ALTER COLUMN earlier_refills SET COMPRESSION lz4, ALTER COLUMN earlier_money SET COMPRESSION lz4,
        ALTER COLUMN earlier_actors SET COMPRESSION lz4, ALTER COLUMN earlier_reasons SET COMPRESSION lz4,
        ALTER COLUMN earlier_details SET COMPRESSION lz4, ALTER COLUMN earlier_hashes SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    NULL; -- a server built without lz4 keeps pglz
END
$$;
-- +goose StatementEnd
-- One index entry per record, not per entry: an admission's entries in a
-- record are found through its lease (ledger.Filter.Lease).
CREATE INDEX ledger_rows_lease_idx ON ledger_rows (lease_id) WHERE lease_id IS NOT NULL;

CREATE VIEW ledger_entries AS
SELECT r.tenant_id, r.seq - x.back AS seq, x.kind, r.created_at, x.admission_id, x.model, x.estimate, x.actual,
       x.refill_micro, r.delta_micro, r.balance_micro, r.period_start, r.period_used, r.late, x.actor, x.reason,
       x.detail, x.prev_hash, x.hash, x.money_micro, r.windows,
       r.seq AS row_seq, r.admission_id AS row_admission_id, r.lease_id AS row_lease_id
FROM ledger_rows r
CROSS JOIN LATERAL (
    SELECT i.back, i.kind, i.admission_id, i.model, i.estimate, i.actual, i.refill_micro, i.actor, i.reason,
           i.detail, CASE WHEN i.o = 1 THEN r.earlier_prev ELSE r.earlier_hashes[i.o - 1] END AS prev_hash,
           i.hash, i.money_micro
    FROM unnest(r.earlier_kinds, r.earlier_admissions, r.earlier_models, r.earlier_estimates, r.earlier_actuals,
                r.earlier_refills, r.earlier_actors, r.earlier_reasons, r.earlier_details, r.earlier_hashes,
                r.earlier_money)
         WITH ORDINALITY AS u (kind, admission_id, model, estimate, actual, refill_micro, actor, reason, detail,
                               hash, money_micro, o),
         LATERAL (SELECT cardinality(r.earlier_hashes) - u.o + 1 AS back, u.*) i
    WHERE r.earlier_hashes IS NOT NULL
    UNION ALL
    SELECT 0, r.kind, r.admission_id, r.model, r.estimate, r.actual, r.refill_micro, r.actor, r.reason, r.detail,
           r.prev_hash, r.hash, r.money_micro
) x;

-- The entry's canonical bytes (00004, 00016), for the view's rows: an
-- auditor's check reads the same as before,
--   SELECT tenant_id, seq FROM ledger_entries e
--   WHERE hash <> sha256(prev_hash || ledger_canonical(e));
-- (The function of 00016 goes on taking a ledger_rows row: a row's own
-- entry.)
-- +goose StatementBegin
CREATE FUNCTION ledger_canonical(e ledger_entries) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ledger_field('tokengate-ledger-v1')
    || ledger_field(e.tenant_id)
    || ledger_field(e.seq::text)
    || ledger_field(e.kind)
    || ledger_field(ledger_micros(e.created_at))
    || ledger_field(coalesce(e.admission_id, ''))
    || ledger_field(coalesce(e.model, ''))
    || coalesce(ledger_field(e.estimate::text), '\x7e'::bytea)
    || coalesce(ledger_field(e.actual::text), '\x7e'::bytea)
    || ledger_field(e.refill_micro::text)
    || ledger_field(e.delta_micro::text)
    || ledger_field(e.balance_micro::text)
    || coalesce(ledger_field(ledger_micros(e.period_start)), '\x7e'::bytea)
    || ledger_field(e.period_used::text)
    || ledger_field(CASE WHEN e.late THEN '1' ELSE '0' END)
    || ledger_field(e.actor)
    || ledger_field(coalesce(e.reason, ''))
    || ledger_field(coalesce(e.detail, ''))
    || CASE WHEN e.money_micro IS NULL AND e.windows IS NULL THEN '\x'::bytea
            ELSE ledger_field('v2')
                 || coalesce(ledger_field(e.money_micro::text), '\x7e'::bytea)
                 || coalesce(ledger_field(e.windows), '\x7e'::bytea) END $$;
-- +goose StatementEnd

-- An older replica's insert (its entry_insert.sql names ledger_entries):
-- each entry a row of its own, as it wrote them.
-- +goose StatementBegin
CREATE FUNCTION ledger_entries_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger_rows (tenant_id, seq, kind, created_at, admission_id, model, estimate, actual, refill_micro,
                             delta_micro, balance_micro, period_start, period_used, late, actor, reason, detail,
                             prev_hash, hash, money_micro, windows)
    VALUES (NEW.tenant_id, NEW.seq, NEW.kind, NEW.created_at, NEW.admission_id, NEW.model, NEW.estimate, NEW.actual,
            NEW.refill_micro, NEW.delta_micro, NEW.balance_micro, NEW.period_start, NEW.period_used,
            coalesce(NEW.late, false), NEW.actor, NEW.reason, NEW.detail, NEW.prev_hash, NEW.hash, NEW.money_micro,
            NEW.windows);
    RETURN NEW;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER ledger_entries_insert INSTEAD OF INSERT ON ledger_entries
    FOR EACH ROW EXECUTE FUNCTION ledger_entries_insert();

-- +goose Down
-- Every record's earlier entries become rows of their own again.
INSERT INTO ledger_rows (tenant_id, seq, kind, created_at, admission_id, model, estimate, actual, refill_micro,
                         delta_micro, balance_micro, period_start, period_used, late, actor, reason, detail,
                         prev_hash, hash, money_micro, windows)
SELECT tenant_id, seq, kind, created_at, admission_id, model, estimate, actual, refill_micro, delta_micro,
       balance_micro, period_start, period_used, late, actor, reason, detail, prev_hash, hash, money_micro, windows
FROM ledger_entries
WHERE seq <> row_seq;
DROP TRIGGER ledger_entries_insert ON ledger_entries;
DROP FUNCTION ledger_entries_insert();
DROP FUNCTION ledger_canonical(ledger_entries);
DROP VIEW ledger_entries;
DROP INDEX ledger_rows_lease_idx;
ALTER TABLE ledger_rows DROP CONSTRAINT ledger_rows_earlier_check,
    DROP COLUMN lease_id, DROP COLUMN earlier_prev, DROP COLUMN earlier_kinds, DROP COLUMN earlier_admissions,
    DROP COLUMN earlier_models, DROP COLUMN earlier_estimates, DROP COLUMN earlier_actuals,
    DROP COLUMN earlier_refills, DROP COLUMN earlier_money, DROP COLUMN earlier_actors, DROP COLUMN earlier_reasons,
    DROP COLUMN earlier_details, DROP COLUMN earlier_hashes;
ALTER TABLE ledger_rows RENAME TO ledger_entries;
