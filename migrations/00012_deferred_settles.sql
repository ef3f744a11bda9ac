-- +goose Up
-- Settles and releases that named by Idempotency-Key an admission the
-- store did not know yet, kept for one a replica admitted on its own during
-- an outage and has not replayed: the replay of that admission applies the
-- row, in its own transaction, and deletes it (budget.ReplayReserve).
-- A gateway never retries its stream-end call, so this row is all there is
-- of the request's usage. The first row of a key wins. A row is kept only
-- while the admission could still arrive (the idempotency window, 24 h),
-- then purged with the expired keys.
CREATE TABLE deferred_settles (
    tenant_id           text        NOT NULL REFERENCES tenants (id),
    key                 text        NOT NULL,
    kind                text        NOT NULL CHECK (kind IN ('settle', 'release')),
    input_tokens        bigint      NOT NULL DEFAULT 0,
    output_tokens       bigint      NOT NULL DEFAULT 0,
    cached_input_tokens bigint      NOT NULL DEFAULT 0,
    refund_tokens       bigint      NOT NULL DEFAULT 0,
    actor               text        NOT NULL,
    key_id              text        NOT NULL DEFAULT '',
    gateway_id          text        NOT NULL DEFAULT '',
    created_at          timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX deferred_settles_created_idx ON deferred_settles (created_at);

-- +goose Down
DROP TABLE deferred_settles;
