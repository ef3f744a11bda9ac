-- +goose Up
-- Admin tokens authenticate the admin API and the dashboard. Like tenant
-- keys, only the SHA-256 of the secret is stored.
CREATE TABLE admin_tokens (
    id           text        PRIMARY KEY,
    name         text        NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
    secret_hash  bytea       NOT NULL CHECK (length(secret_hash) = 32),
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);
CREATE UNIQUE INDEX admin_tokens_name_idx ON admin_tokens (name) WHERE revoked_at IS NULL;

-- Dashboard sessions, shared by every replica. The cookie holds a random
-- secret; the table holds its SHA-256 and the session's CSRF token.
CREATE TABLE admin_sessions (
    id_hash    bytea       PRIMARY KEY,
    token_id   text        NOT NULL REFERENCES admin_tokens (id),
    csrf       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX admin_sessions_expires_idx ON admin_sessions (expires_at);

-- Model table entries that admins created or changed. They override the
-- seeded table compiled into the binary, by name.
CREATE TABLE models (
    name                  text        PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 256),
    encoding              text        NOT NULL CHECK (encoding IN ('o200k_base', 'cl100k_base')),
    input_weight_micro    bigint      NOT NULL CHECK (input_weight_micro > 0),
    output_weight_micro   bigint      NOT NULL CHECK (output_weight_micro > 0),
    default_output_tokens bigint      NOT NULL CHECK (default_output_tokens > 0),
    context_window        bigint      NOT NULL CHECK (context_window > 0),
    part_tokens           bigint      NOT NULL CHECK (part_tokens > 0),
    updated_at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_by            text        NOT NULL
);

-- Rejections are not written one by one (a rejected request writes
-- nothing); each replica adds its per-minute tallies here every few
-- seconds, so the dashboard sees every replica's throttling.
CREATE TABLE rejection_counts (
    tenant_id  text        NOT NULL,
    minute     timestamptz NOT NULL,
    limit_name text        NOT NULL,
    count      bigint      NOT NULL,
    PRIMARY KEY (tenant_id, minute, limit_name)
);
CREATE INDEX rejection_counts_minute_idx ON rejection_counts (minute);

-- Ledger queries by tenant and time range, paged in the same order.
CREATE INDEX ledger_entries_tenant_created_idx ON ledger_entries (tenant_id, created_at, seq);

-- +goose Down
DROP INDEX ledger_entries_tenant_created_idx;
DROP TABLE rejection_counts;
DROP TABLE models;
DROP TABLE admin_sessions;
DROP TABLE admin_tokens;
