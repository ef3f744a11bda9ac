-- +goose Up
-- Batches (issue 38): a tenant's batch traffic is admitted against an
-- enqueued-tokens allowance of its own, beside the per-minute buckets. It
-- is a capacity, not a rate: a batch's whole estimate (at batch prices) is
-- taken from it when the batch is created and given back line by line as
-- its lines settle or are refunded; time alone never refills it. Its rows
-- are changed only under their tenant's row lock (lock order: tenant, then
-- allowance, then batch), so the bound is exact across replicas.
CREATE TABLE batch_allowances (
    tenant_id      text        PRIMARY KEY REFERENCES tenants (id),
    -- capacity_micro: how much may be enqueued at once, in micro cost
    -- units at batch prices; 0 refuses every batch.
    capacity_micro bigint      NOT NULL CHECK (capacity_micro >= 0),
    enqueued_micro bigint      NOT NULL DEFAULT 0 CHECK (enqueued_micro >= 0),
    -- models a batch line may name; empty: any model.
    models         text[]      NOT NULL DEFAULT '{}',
    updated_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- An uploaded batch input file, as the proxy estimated it line by line
-- before forwarding it: a batch created from it reserves these lines.
CREATE TABLE batch_files (
    id         text        NOT NULL, -- the upstream's file id
    provider   text        NOT NULL CHECK (provider IN ('openai', 'anthropic')),
    tenant_id  text        NOT NULL REFERENCES tenants (id),
    endpoint   text        NOT NULL,
    lines      integer     NOT NULL CHECK (lines > 0),
    created_at timestamptz NOT NULL,
    PRIMARY KEY (provider, id)
);

CREATE TABLE batch_file_lines (
    provider            text   NOT NULL,
    file_id             text   NOT NULL,
    line                integer NOT NULL,
    custom_id           text   NOT NULL,
    model               text   NOT NULL,
    input_tokens        bigint NOT NULL,
    output_tokens       bigint NOT NULL,
    input_weight_micro  bigint NOT NULL,
    output_weight_micro bigint NOT NULL,
    reserved_micro      bigint NOT NULL CHECK (reserved_micro >= 0),
    PRIMARY KEY (provider, file_id, custom_id),
    FOREIGN KEY (provider, file_id) REFERENCES batch_files (provider, id) ON DELETE CASCADE
);

-- A batch: its whole reservation, held until the upstream reports it ended
-- or its completion window passes (the sweeper then refunds what is left).
CREATE TABLE batches (
    id             text        PRIMARY KEY, -- tokengate's: the ledger's admission_id of every entry
    provider       text        NOT NULL CHECK (provider IN ('openai', 'anthropic')),
    upstream_id    text,                    -- the upstream's batch id, once it accepted the batch
    tenant_id      text        NOT NULL REFERENCES tenants (id),
    key_id         text        NOT NULL,
    file_id        text,
    state          text        NOT NULL CHECK (state IN ('open', 'ended')),
    lines          integer     NOT NULL CHECK (lines > 0),
    reserved_micro bigint      NOT NULL CHECK (reserved_micro >= 0),
    created_at     timestamptz NOT NULL,
    expires_at     timestamptz NOT NULL,
    ended_at       timestamptz,
    outcome        text, -- the upstream's final status, or 'expired' by the sweeper, or 'refused'
    -- the files the upstream answered it with (output, errors): the
    -- tenant may read them through the proxy, no other tenant may.
    output_files   text[]      NOT NULL DEFAULT '{}',
    UNIQUE (provider, upstream_id)
);
CREATE INDEX batches_open_expiry_idx ON batches (expires_at) WHERE state = 'open';

-- A batch's lines: each reserved at its estimate, then settled from the
-- usage its output reports, or refunded (failed, expired, cancelled).
CREATE TABLE batch_lines (
    batch_id            text   NOT NULL REFERENCES batches (id),
    custom_id           text   NOT NULL,
    model               text   NOT NULL,
    input_tokens        bigint NOT NULL,
    output_tokens       bigint NOT NULL,
    input_weight_micro  bigint NOT NULL,
    output_weight_micro bigint NOT NULL,
    reserved_micro      bigint NOT NULL CHECK (reserved_micro >= 0),
    state               text   NOT NULL CHECK (state IN ('enqueued', 'settled', 'refunded')),
    outcome             text, -- succeeded, failed, expired, cancelled
    actual_input        bigint,
    actual_output       bigint,
    actual_micro        bigint,
    PRIMARY KEY (batch_id, custom_id)
);

-- The ledger tells a batch's story in kinds of its own (admission_id is the
-- batch's id): batch_reserve, batch_settle (lines with usage), batch_refund
-- (lines failed, expired or cancelled), and limits for an allowance change.
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_kind_check;
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_kind_check
    CHECK (kind IN ('reserve', 'settle', 'release', 'expire', 'adjust', 'limits', 'tenant',
                    'batch_reserve', 'batch_settle', 'batch_refund'));

-- +goose Down
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_kind_check;
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_kind_check
    CHECK (kind IN ('reserve', 'settle', 'release', 'expire', 'adjust', 'limits', 'tenant'));
DROP TABLE batch_lines;
DROP TABLE batches;
DROP TABLE batch_file_lines;
DROP TABLE batch_files;
DROP TABLE batch_allowances;
