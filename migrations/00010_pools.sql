-- +goose Up
-- Upstream capacity pools. A pool models one upstream deployment's own
-- limit (a provider's TPM for a model, a self-hosted replica set's
-- throughput) as a token bucket in raw tokens (input + output). Admissions
-- of the models routed to it must also fit it. Its row is locked after the
-- tenant rows and the admission rows (the one global lock order), so pools
-- shared by many tenants cannot deadlock with them.
CREATE TABLE pools (
    id                text        PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    tokens_capacity   bigint      NOT NULL CHECK (tokens_capacity > 0),
    tokens_rate_micro bigint      NOT NULL CHECK (tokens_rate_micro > 0),
    tokens_micro      bigint      NOT NULL,
    tokens_at         timestamptz NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Which models draw on which pool (a model table entry, or a model name
-- the table does not know).
CREATE TABLE pool_models (
    model   text PRIMARY KEY CHECK (length(model) BETWEEN 1 AND 200),
    pool_id text NOT NULL REFERENCES pools (id) ON DELETE CASCADE
);
CREATE INDEX pool_models_pool_idx ON pool_models (pool_id);

-- Each tenant's share of a pool: its weight, and its virtual token counter
-- (Sheng et al., OSDI 2024): the raw tokens it was served, divided by its
-- weight, in micro units. Waiting requests are admitted lowest counter
-- first. Written only under the pool's row lock.
CREATE TABLE pool_shares (
    pool_id     text        NOT NULL REFERENCES pools (id) ON DELETE CASCADE,
    tenant_id   text        NOT NULL REFERENCES tenants (id),
    weight      integer     NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000000),
    vtc_micro   bigint      NOT NULL DEFAULT 0,
    served      bigint      NOT NULL DEFAULT 0,
    active_at   timestamptz,
    PRIMARY KEY (pool_id, tenant_id)
);

-- A key's priority class: among requests waiting for a pool, critical ones
-- are admitted before standard ones, and standard before sheddable.
ALTER TABLE api_keys ADD COLUMN priority text NOT NULL DEFAULT 'standard'
    CHECK (priority IN ('critical', 'standard', 'sheddable'));

-- The pool an admission drew on: its end corrects that pool.
ALTER TABLE admissions ADD COLUMN pool_id text;

-- +goose Down
ALTER TABLE admissions DROP COLUMN pool_id;
ALTER TABLE api_keys DROP COLUMN priority;
DROP TABLE pool_shares;
DROP TABLE pool_models;
DROP TABLE pools;
