-- +goose Up
-- End users (issue 25): a tenant's own users, each a leaf budget of its own
-- below the tenant, created on first sight from the tenant's template
-- (budget/enduser.go). An end user is an ordinary tenant row, so every rule
-- of nested budgets holds for it; these columns only say whose end user it
-- is, which id the tenant's requests named it by, and since when it has
-- been idle long enough to stop counting toward the tenant's cap.
ALTER TABLE tenants
    ADD COLUMN end_user_of text REFERENCES tenants (id),
    ADD COLUMN end_user_id text CHECK (end_user_id <> '' AND length(end_user_id) <= 256),
    ADD COLUMN end_user_expired_at timestamptz,
    ADD CONSTRAINT tenants_end_user CHECK ((end_user_of IS NULL) = (end_user_id IS NULL)
        AND (end_user_of IS NULL OR end_user_of = parent_id)
        AND (end_user_expired_at IS NULL OR end_user_of IS NOT NULL));
-- One row per (tenant, end user id); also how a tenant's end users are
-- counted and listed.
CREATE UNIQUE INDEX tenants_end_user_idx ON tenants (end_user_of, end_user_id) WHERE end_user_of IS NOT NULL;

-- A tenant's end-user policy: where a request names its end user, the
-- limits each end user is created with, how many it may have (live, not
-- expired), and how long an idle one lives. Written only under the
-- tenant's row lock, with a limits entry in the tenant's chain.
CREATE TABLE end_user_policies (
    tenant_id     text        PRIMARY KEY REFERENCES tenants (id),
    source        text        NOT NULL CHECK (source IN ('user', 'safety_identifier', 'metadata.user_id', 'header')),
    header        text        CHECK (header ~ '^[A-Za-z0-9!#$%&''*+.^_`|~-]{1,128}$'),
    template      jsonb       NOT NULL,
    max_end_users integer     NOT NULL CHECK (max_end_users > 0),
    idle_ttl_s    bigint      NOT NULL CHECK (idle_ttl_s > 0),
    updated_at    timestamptz NOT NULL,
    updated_by    text        NOT NULL,
    CHECK ((source = 'header') = (header IS NOT NULL))
);

-- +goose Down
DROP TABLE end_user_policies;
DROP INDEX tenants_end_user_idx;
ALTER TABLE tenants DROP CONSTRAINT tenants_end_user,
    DROP COLUMN end_user_expired_at, DROP COLUMN end_user_id, DROP COLUMN end_user_of;
