-- +goose Up
-- Per-model limits of a tenant, with separate input and output token
-- buckets (like Anthropic's ITPM and OTPM): an admission for the model must
-- fit both, beside the tenant-wide limits. A row is only read and written
-- under its tenant's row lock, so it needs no lock of its own. Amounts are
-- raw tokens (not weighted cost), in micro units like the tenant buckets.
CREATE TABLE tenant_model_limits (
    tenant_id          text        NOT NULL REFERENCES tenants (id),
    model              text        NOT NULL CHECK (length(model) BETWEEN 1 AND 200),
    input_capacity     bigint      CHECK (input_capacity > 0),
    input_rate_micro   bigint      CHECK (input_rate_micro > 0),
    output_capacity    bigint      CHECK (output_capacity > 0),
    output_rate_micro  bigint      CHECK (output_rate_micro > 0),
    input_micro        bigint      NOT NULL DEFAULT 0,
    input_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    output_micro       bigint      NOT NULL DEFAULT 0,
    output_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    shadow_limits      text[]      NOT NULL DEFAULT '{}',
    PRIMARY KEY (tenant_id, model),
    CHECK ((input_capacity IS NULL) = (input_rate_micro IS NULL)),
    CHECK ((output_capacity IS NULL) = (output_rate_micro IS NULL)),
    CHECK (input_capacity IS NOT NULL OR output_capacity IS NOT NULL)
);

-- How many model limits the tenant has, kept under its row lock: the
-- decision's lock statement reads a tenant's model limits only when it has
-- some, so tenants without any pay nothing for the feature.
ALTER TABLE tenants ADD COLUMN model_limits integer NOT NULL DEFAULT 0 CHECK (model_limits >= 0);

-- The model table entry an admission was estimated with (its model limits
-- are keyed by it), and the levels whose model buckets it debited: its end
-- corrects exactly those, whatever limits changed meanwhile.
ALTER TABLE admissions
    ADD COLUMN family text,
    ADD COLUMN model_levels text[] NOT NULL DEFAULT '{}';

-- +goose Down
ALTER TABLE admissions DROP COLUMN model_levels, DROP COLUMN family;
ALTER TABLE tenants DROP COLUMN model_limits;
DROP TABLE tenant_model_limits;
