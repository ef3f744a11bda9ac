-- +goose Up
-- Gateways (Envoy's rate limit filter through `serve --rls-addr`, say) ask
-- on behalf of many tenants. Each has a credential of its own
-- (tgw_<id>_<secret>, only the secret's SHA-256 stored) and may name only
-- the tenants it is scoped to ('*' for every tenant).
CREATE TABLE gateway_credentials (
    id           text        PRIMARY KEY,
    name         text        NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
    secret_hash  bytea       NOT NULL,
    tenants      text[]      NOT NULL CHECK (cardinality(tenants) > 0),
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);
CREATE UNIQUE INDEX gateway_credentials_name_idx ON gateway_credentials (name) WHERE revoked_at IS NULL;

-- +goose Down
DROP TABLE gateway_credentials;
