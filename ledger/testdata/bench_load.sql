-- Loads tenants bench-$1 to bench-$2 with $3 ledger entries each, with valid hash chains and
-- arithmetic, entirely in the database: generate_series makes the tenants,
-- and a recursive query appends one entry per tenant per step, hashing it
-- with ledger_canonical (migration 00004). Entries alternate reserve (100
-- tokens) and settle (60 actual, 40 refunded, 60 refilled), 1 s apart.
-- ("OFFSET 0" keeps each row's values computed once, not once per use.)
WITH RECURSIVE chain AS (
    SELECT e.tenant_id, e.seq, e.kind, e.created_at, e.admission_id, e.model, e.estimate, e.actual,
           e.refill_micro, e.delta_micro, e.balance_micro, e.period_start, e.period_used, e.late, e.actor,
           e.reason, e.detail, e.prev_hash, sha256(e.prev_hash || ledger_canonical(ROW(e.*)::ledger_entries)) AS hash
    FROM (
        SELECT 'bench-' || lpad(g.t::text, 5, '0') AS tenant_id, 1::bigint AS seq, 'tenant'::text AS kind,
               timestamptz '2026-01-01 00:00:00+00' + g.t * interval '1 ms' AS created_at,
               NULL::text AS admission_id, NULL::text AS model, NULL::bigint AS estimate, NULL::bigint AS actual,
               0::bigint AS refill_micro, 1000000000000::bigint AS delta_micro, 1000000000000::bigint AS balance_micro,
               NULL::timestamptz AS period_start, 0::bigint AS period_used, false AS late, 'bench'::text AS actor,
               'created'::text AS reason, NULL::text AS detail, '\x'::bytea AS prev_hash, NULL::bytea AS hash
        FROM generate_series($1::int, $2::int) AS g(t)
        OFFSET 0
    ) e
  UNION ALL
    SELECT n.tenant_id, n.seq, n.kind, n.created_at, n.admission_id, n.model, n.estimate, n.actual,
           n.refill_micro, n.delta_micro, n.balance_micro, n.period_start, n.period_used, n.late, n.actor,
           n.reason, n.detail, n.prev_hash, sha256(n.prev_hash || ledger_canonical(ROW(n.*)::ledger_entries))
    FROM chain c
    CROSS JOIN LATERAL (
        SELECT c.tenant_id, c.seq + 1 AS seq,
               CASE WHEN c.seq % 2 = 1 THEN 'reserve' ELSE 'settle' END AS kind,
               c.created_at + interval '1 s' AS created_at,
               'adm_' || c.tenant_id || '_' || CASE WHEN c.seq % 2 = 1 THEN c.seq + 1 ELSE c.seq END AS admission_id,
               'gpt-4o'::text AS model, 100::bigint AS estimate,
               CASE WHEN c.seq % 2 = 1 THEN NULL ELSE 60 END::bigint AS actual,
               CASE WHEN c.seq % 2 = 1 THEN 0 ELSE 60000000 END::bigint AS refill_micro,
               CASE WHEN c.seq % 2 = 1 THEN -100000000 ELSE 40000000 END::bigint AS delta_micro,
               c.balance_micro + CASE WHEN c.seq % 2 = 1 THEN -100000000 ELSE 100000000 END AS balance_micro,
               NULL::timestamptz AS period_start, 0::bigint AS period_used, false AS late, 'key:bench'::text AS actor,
               NULL::text AS reason, NULL::text AS detail, c.hash AS prev_hash, NULL::bytea AS hash
        WHERE c.seq < $3::int
        OFFSET 0
    ) n
)
INSERT INTO ledger_rows (tenant_id, seq, kind, created_at, admission_id, model, estimate, actual, refill_micro,
                         delta_micro, balance_micro, period_start, period_used, late, actor, reason, detail,
                         prev_hash, hash)
SELECT * FROM chain
