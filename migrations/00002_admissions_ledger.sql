-- +goose Up
-- Per-tenant admission control settings that are not bucket limits.
ALTER TABLE tenants
    ADD COLUMN max_wait_ms bigint NOT NULL DEFAULT 30000 CHECK (max_wait_ms >= 0);

-- An admission is one reserved estimate and, later, its reconciliation.
-- Its row is only ever changed while the tenant's row is locked, and the
-- lock order is always tenant, then admission.
CREATE TABLE admissions (
    id                   text        PRIMARY KEY,
    tenant_id            text        NOT NULL REFERENCES tenants (id),
    state                text        NOT NULL CHECK (state IN ('reserved', 'settled', 'released', 'expired')),
    model                text        NOT NULL,
    input_tokens         bigint      NOT NULL,
    output_tokens        bigint      NOT NULL,
    cost                 bigint      NOT NULL CHECK (cost >= 0),
    approximate          boolean     NOT NULL,
    input_weight_micro   bigint      NOT NULL,
    output_weight_micro  bigint      NOT NULL,
    created_at           timestamptz NOT NULL,
    expires_at           timestamptz NOT NULL,
    -- reconciliation; set by settle, release or expiry
    ended_at             timestamptz,
    late                 boolean     NOT NULL DEFAULT false,
    actual_input         bigint,
    actual_output        bigint,
    actual_cost          bigint,
    -- the answer a repeated settle or release gets back
    end_delta_micro      bigint,
    end_balance_micro    bigint
);
CREATE INDEX admissions_tenant_created_idx ON admissions (tenant_id, created_at);
-- The sweeper's work list: only open reservations are indexed.
CREATE INDEX admissions_open_expiry_idx ON admissions (expires_at, tenant_id) WHERE state = 'reserved';

-- Idempotency keys: unique per tenant, honoured for 24 h. The response of
-- the original admission is replayed as it was sent.
CREATE TABLE idempotency_keys (
    tenant_id    text        NOT NULL REFERENCES tenants (id),
    key          text        NOT NULL,
    admission_id text        NOT NULL REFERENCES admissions (id),
    request_hash bytea       NOT NULL,
    response     bytea       NOT NULL,
    created_at   timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX idempotency_keys_created_idx ON idempotency_keys (created_at);

-- The ledger: one row per state change, hash-chained per tenant. Amounts of
-- the token balance are micro-tokens, like tenants.tokens_micro, so that
-- balance_micro(n) = balance_micro(n-1) + refill_micro(n) + delta_micro(n)
-- holds exactly for every entry.
CREATE TABLE ledger_entries (
    tenant_id      text        NOT NULL,
    seq            bigint      NOT NULL CHECK (seq > 0),
    kind           text        NOT NULL CHECK (kind IN ('reserve', 'settle', 'release', 'expire', 'adjust', 'limits', 'tenant')),
    created_at     timestamptz NOT NULL,
    admission_id   text,
    model          text,
    estimate       bigint,
    actual         bigint,
    refill_micro   bigint      NOT NULL,
    delta_micro    bigint      NOT NULL,
    balance_micro  bigint      NOT NULL,
    period_start   timestamptz,
    period_used    bigint      NOT NULL,
    late           boolean     NOT NULL DEFAULT false,
    actor          text        NOT NULL,
    reason         text,
    detail         text,
    prev_hash      bytea       NOT NULL,
    hash           bytea       NOT NULL CHECK (length(hash) = 32),
    PRIMARY KEY (tenant_id, seq)
);
CREATE INDEX ledger_entries_admission_idx ON ledger_entries (admission_id) WHERE admission_id IS NOT NULL;
-- Keyset paging over every tenant: ORDER BY (created_at, tenant_id, seq).
CREATE INDEX ledger_entries_created_idx ON ledger_entries (created_at, tenant_id, seq);

-- +goose StatementBegin
CREATE FUNCTION ledger_entries_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger_entries is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER ledger_entries_no_update_delete
    BEFORE UPDATE OR DELETE ON ledger_entries
    FOR EACH ROW EXECUTE FUNCTION ledger_entries_append_only();
CREATE TRIGGER ledger_entries_no_truncate
    BEFORE TRUNCATE ON ledger_entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_entries_append_only();

-- +goose Down
DROP TABLE ledger_entries;
DROP FUNCTION ledger_entries_append_only();
DROP TABLE idempotency_keys;
DROP TABLE admissions;
ALTER TABLE tenants DROP COLUMN max_wait_ms;
