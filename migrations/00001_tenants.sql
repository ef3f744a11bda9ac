-- +goose Up
-- A tenant is one row: its limits, its balances and the head of its ledger
-- chain. Every admission decision locks this row (SELECT .. FOR UPDATE), so
-- refill and deduct are atomic across every replica.
--
-- Token and request amounts are fixed point: 1 token = 1 000 000 units
-- ("micro-tokens"), so refill at fractional rates is exact integer arithmetic.
CREATE TABLE tenants (
    id                    text        PRIMARY KEY
                                      CHECK (id ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    disabled_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT clock_timestamp(),

    -- limits
    tokens_capacity       bigint      NOT NULL CHECK (tokens_capacity > 0),
    tokens_rate_micro     bigint      NOT NULL CHECK (tokens_rate_micro > 0),
    requests_capacity     bigint      CHECK (requests_capacity > 0),
    requests_rate_micro   bigint      CHECK (requests_rate_micro > 0),
    max_concurrent        integer     CHECK (max_concurrent > 0),
    period_budget         bigint      CHECK (period_budget > 0),
    period                text        CHECK (period IN ('day', 'month')),
    reservation_ttl_ms    bigint      NOT NULL DEFAULT 600000 CHECK (reservation_ttl_ms > 0),

    -- balances
    tokens_micro          bigint      NOT NULL,
    tokens_at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    requests_micro        bigint,
    requests_at           timestamptz,
    open_reservations     integer     NOT NULL DEFAULT 0 CHECK (open_reservations >= 0),
    period_start          timestamptz,
    period_used           bigint      NOT NULL DEFAULT 0,

    -- ledger chain head, so an append needs no extra read
    ledger_seq            bigint      NOT NULL DEFAULT 0,
    ledger_hash           bytea       NOT NULL DEFAULT '\x'::bytea,

    CHECK ((requests_capacity IS NULL) = (requests_rate_micro IS NULL)),
    CHECK ((period_budget IS NULL) = (period IS NULL))
);

-- Tenant API keys. The secret is never stored: only its SHA-256. The key id
-- (the part of the key before the secret) is the lookup; the hash is then
-- compared in constant time.
CREATE TABLE api_keys (
    id           text        PRIMARY KEY,
    tenant_id    text        NOT NULL REFERENCES tenants (id),
    secret_hash  bytea       NOT NULL CHECK (length(secret_hash) = 32),
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);
CREATE INDEX api_keys_tenant_idx ON api_keys (tenant_id);

-- +goose Down
DROP TABLE api_keys;
DROP TABLE tenants;
