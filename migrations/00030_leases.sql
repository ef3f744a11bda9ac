-- +goose Up
-- Quota leasing (budget/lease, docs/leasing.md). Numbered 00030, above the
-- highest migration when it was written, to leave room for migrations
-- written at the same time on other branches.
--
-- A lease is a slice of a tenant's token budget pre-debited at every level
-- of its tree (one lease_take entry per level, under the tree's row
-- locks), from which one holder (a replica) admits in memory. used_micro
-- counts what the holder's journal has committed against it; a journal
-- write may never take it past slice_micro, nor write after the lease is
-- over (state) or after expires_at: the lease row, not the tenant row, is
-- the lock a journal write takes.
CREATE TABLE leases (
    id           text        PRIMARY KEY,
    tenant_id    text        NOT NULL REFERENCES tenants (id),
    holder       text        NOT NULL,
    state        text        NOT NULL CHECK (state IN ('live', 'returned', 'expired')),
    levels       text[]      NOT NULL,  -- the tree it was taken at, root first
    slice_micro  bigint      NOT NULL CHECK (slice_micro >= 0),
    used_micro   bigint      NOT NULL DEFAULT 0 CHECK (used_micro >= 0 AND used_micro <= slice_micro),
    -- what the ledger already records of used_micro (reconciled journal rows)
    booked_micro bigint      NOT NULL DEFAULT 0 CHECK (booked_micro >= 0 AND booked_micro <= used_micro),
    taken_at     timestamptz NOT NULL,
    renewed_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    ended_at     timestamptz
);
CREATE INDEX leases_live_expiry_idx ON leases (expires_at) WHERE state = 'live';
CREATE INDEX leases_tenant_idx ON leases (tenant_id) WHERE state = 'live';

-- The journal of admissions made from a lease: written before the holder
-- answers, many per transaction (group commit), without the tenant row
-- lock. Reconciliation (a renew, a return, the sweeper; under the tree's
-- locks) appends each row's chained ledger entries, in seq order, and sets
-- booked.
CREATE TABLE lease_admissions (
    lease_id     text        NOT NULL REFERENCES leases (id),
    seq          bigint      GENERATED ALWAYS AS IDENTITY,
    admission_id text        NOT NULL UNIQUE,
    model        text        NOT NULL,
    cost         bigint      NOT NULL CHECK (cost >= 0),
    cost_micro   bigint      NOT NULL CHECK (cost_micro >= 0),
    money_micro  bigint,
    created_at   timestamptz NOT NULL,
    booked       boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (lease_id, seq)
);
CREATE INDEX lease_admissions_unbooked_idx ON lease_admissions (lease_id, seq) WHERE NOT booked;

-- A tenant's lease mode (budget/lease, mode.go): off (no row, the default)
-- or auto (its replicas lease its budget when no level of its tree has a
-- rule only exact mode keeps). Written under the tenant's row lock with a
-- limits entry.
CREATE TABLE lease_modes (
    tenant_id  text        PRIMARY KEY REFERENCES tenants (id),
    mode       text        NOT NULL CHECK (mode IN ('off', 'auto')),
    updated_at timestamptz NOT NULL,
    actor      text        NOT NULL
);

-- The ledger tells a lease's story in kinds of its own (admission_id is
-- the lease's id): lease_take (the pre-debit), lease_return (what was not
-- used, refunded by a return or at expiry). An admission made from a lease
-- is a reserve entry that moves nothing, its cost already taken.
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_kind_check;
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_kind_check
    CHECK (kind IN ('reserve', 'settle', 'release', 'expire', 'adjust', 'limits', 'tenant',
                    'batch_reserve', 'batch_settle', 'batch_refund',
                    'lease_take', 'lease_return'));

-- +goose Down
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_kind_check;
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_kind_check
    CHECK (kind IN ('reserve', 'settle', 'release', 'expire', 'adjust', 'limits', 'tenant',
                    'batch_reserve', 'batch_settle', 'batch_refund'));
DROP TABLE lease_modes;
DROP TABLE lease_admissions;
DROP TABLE leases;
