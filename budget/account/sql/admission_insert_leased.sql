-- The admissions a lease journal group commit makes (budget/lease), of all
-- its leases, with their Idempotency-Keys, in one statement: each is
-- written once, here, where it lives, and its lease's booking later only
-- appends its chained ledger entries (admission_lease_book.sql).
--
-- created_at is the store's clock ($22, a frozen clock, or none), the same
-- for the whole group and its keys (c: a CTE read twice is computed once,
-- so the keys need not read it back from the admissions' RETURNING);
-- expires_at, unless given, that plus the tenant's reservation TTL: as the
-- replica last read it ($23, the lease's snapshot, which the answer's
-- expiry is computed from too), or, when it does not know it (NULL), read
-- here without a lock (a subquery run only then). A join with tenants for
-- every admission cost Postgres about 6 us of a keyed admission's 50
-- (make bench-pgcost, "no tenants join"; BENCHMARKS.md, thirteenth step). lease_seq is
-- drawn from admissions_lease_seq in the group's order, under the group's
-- lock of each lease row, held to its commit: a lease's admissions commit
-- in lease_seq order, which the booking's cursor relies on.
--
-- The keys are inserted plainly: a key idempotency_keys already holds,
-- live or forgotten (older than 24 h, not purged yet), fails the statement
-- (unique_violation), and with it the group's transaction. The group holds
-- the keys' advisory locks, and either read the live ones first and left
-- their admissions out and deleted the forgotten ones
-- (idempotency_forget.sql: the careful way), or was sent in one round trip
-- and read neither; the journal then writes it again the careful way. An
-- ON CONFLICT clause would decide the same in the statement, but makes
-- every key a speculative insertion (a conflict check before the insert,
-- a lock of its own, a second WAL record to confirm it): about 2 us of
-- Postgres's CPU per keyed admission, out of about 40 (BENCHMARKS.md,
-- "Quota leasing, ninth step"), on every group, to save work on a replay.
WITH c AS (
    SELECT coalesce($22::timestamptz, clock_timestamp()) AS at
), a AS (
    INSERT INTO admissions (
        id, tenant_id, state, model, input_tokens, output_tokens, cost, approximate,
        input_weight_micro, output_weight_micro, created_at, expires_at, family,
        price_model, price_from, money_estimate, face, price_tier, lease_id, lease_seq, lease_actor
    )
    SELECT u.id, u.tenant_id, 'reserved', u.model, u.input_tokens, u.output_tokens, u.cost, u.approximate,
           u.input_weight_micro, u.output_weight_micro, c.at,
           coalesce(u.expires_at, c.at + coalesce(u.ttl_ms, (SELECT t.reservation_ttl_ms FROM tenants t WHERE t.id = u.tenant_id))
                                         * interval '1 millisecond'),
           nullif(u.family, ''), nullif(u.price_model, ''), u.price_from, u.money_estimate, u.face,
           nullif(u.price_tier, ''), u.lease_id, nextval('admissions_lease_seq'), nullif(u.actor, '')
    FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::boolean[],
                $8::bigint[], $9::bigint[], $10::timestamptz[], $11::text[], $12::text[], $13::timestamptz[],
                $14::bigint[], $15::text[], $16::text[], $17::text[], $18::text[], $23::bigint[])
         WITH ORDINALITY AS u (id, tenant_id, model, input_tokens, output_tokens, cost, approximate,
                               input_weight_micro, output_weight_micro, expires_at, family, price_model,
                               price_from, money_estimate, face, price_tier, lease_id, actor, ttl_ms, n)
    CROSS JOIN c
    ORDER BY u.n
)
INSERT INTO idempotency_keys (tenant_id, key, admission_id, request_hash, response, created_at)
SELECT u.tenant_id, u.key, u.id, u.request_hash, u.response, c.at
FROM unnest($1::text[], $2::text[], $19::text[], $20::bytea[], $21::bytea[]) AS u (id, tenant_id, key, request_hash, response)
CROSS JOIN c
WHERE u.key <> ''
