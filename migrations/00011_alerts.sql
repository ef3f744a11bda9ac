-- +goose Up
-- Budget alerts, delivered as signed webhooks through an outbox.
--
-- An endpoint is where events go. Its signing secret is never stored: it is
-- derived from the server's alert key (TOKENGATE_ALERT_KEY, never in the
-- database) and the endpoint's salt, so a copy of the database cannot forge
-- or read signatures. Rotating the secret replaces the salt.
CREATE TABLE alert_endpoints (
    id          text        PRIMARY KEY,
    url         text        NOT NULL CHECK (length(url) BETWEEN 8 AND 2000),
    description text        NOT NULL DEFAULT '',
    secret_salt bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    disabled_at timestamptz
);

-- A rule says which events a tenant's budget raises and where they go.
-- tenant_id NULL applies it to every tenant (and every level of a tree).
-- period_budget: thresholds in percent of the period budget.
-- throttled: a limit (or any, limit_name NULL) refusing in every one of
-- the last sustain_minutes minutes. invariant: the ledger watch found a
-- balance or chain that does not recompute.
CREATE TABLE alert_rules (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id       text        REFERENCES tenants (id),
    endpoint_id     text        NOT NULL REFERENCES alert_endpoints (id),
    kind            text        NOT NULL CHECK (kind IN ('period_budget', 'throttled', 'invariant')),
    thresholds      int[]       NOT NULL DEFAULT '{}',
    limit_name      text,
    sustain_minutes int,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    deleted_at      timestamptz,
    CHECK (kind <> 'period_budget' OR (cardinality(thresholds) BETWEEN 1 AND 10 AND 0 < ALL (thresholds) AND 1000 >= ALL (thresholds))),
    CHECK (kind <> 'throttled' OR sustain_minutes BETWEEN 1 AND 1440)
);
CREATE INDEX alert_rules_tenant_idx ON alert_rules (tenant_id) WHERE deleted_at IS NULL;

-- The outbox. An event is written in the same transaction as what raised
-- it (the decision that crossed a threshold, say), and at most once per
-- rule and dedupe key: 'period:<start>:<percent>' is once per threshold per
-- period, whatever the number of replicas. The dispatcher leases due
-- events (FOR UPDATE SKIP LOCKED), delivers them, and records the outcome
-- only while its lease holds, so an event is recorded delivered once.
CREATE TABLE alert_events (
    id              text        PRIMARY KEY,
    rule_id         bigint      NOT NULL REFERENCES alert_rules (id),
    endpoint_id     text        NOT NULL REFERENCES alert_endpoints (id),
    tenant_id       text        NOT NULL,
    type            text        NOT NULL,
    dedupe          text        NOT NULL,
    payload         jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    state           text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts        int         NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    leased_by       text,
    lease_until     timestamptz,
    delivered_at    timestamptz,
    UNIQUE (rule_id, dedupe)
);
CREATE INDEX alert_events_due_idx ON alert_events (next_attempt_at) WHERE state = 'pending';
CREATE INDEX alert_events_tenant_idx ON alert_events (tenant_id, created_at);

-- Every delivery attempt: in_flight while a replica delivers it; then
-- delivered, failed (an error or a non-2xx answer), abandoned (its
-- replica died or lost the lease before it could record an outcome), or
-- superseded (it answered after another replica had taken the event over).
CREATE TABLE alert_attempts (
    event_id    text        NOT NULL REFERENCES alert_events (id),
    attempt     int         NOT NULL,
    replica     text        NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    outcome     text        NOT NULL CHECK (outcome IN ('in_flight', 'delivered', 'failed', 'abandoned', 'superseded')),
    status_code int,
    error       text,
    duration_ms int,
    PRIMARY KEY (event_id, attempt)
);

-- +goose Down
DROP TABLE alert_attempts;
DROP TABLE alert_events;
DROP TABLE alert_rules;
DROP TABLE alert_endpoints;
