-- +goose Up
-- The ledger's canonical encoding and hash, in SQL: the same bytes as
-- ledger.Canonical in Go, so that an auditor can check the chain with
-- nothing but psql:
--   SELECT tenant_id, seq FROM ledger_entries e
--   WHERE hash <> sha256(prev_hash || ledger_canonical(e));
-- Each field is "<byte length>:<bytes>" (text as UTF-8); a null is "~";
-- times are microseconds since the Unix epoch. The database must use UTF8.

-- +goose StatementBegin
CREATE FUNCTION ledger_field(v text) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT textsend(octet_length(v)::text || ':' || v) $$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION ledger_micros(t timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT (extract(epoch FROM t) * 1000000)::bigint::text $$;
-- +goose StatementEnd

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
    || ledger_field(coalesce(e.detail, '')) $$;
-- +goose StatementEnd

-- Admissions by time, for the drift report across tenants.
CREATE INDEX admissions_created_idx ON admissions (created_at);

-- +goose Down
DROP INDEX admissions_created_idx;
DROP FUNCTION ledger_canonical(ledger_entries);
DROP FUNCTION ledger_micros(timestamptz);
DROP FUNCTION ledger_field(text);
