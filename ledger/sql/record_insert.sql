-- Rows of one transaction, as entry_insert.sql, some of them records
-- (00038): a row is its own entry (one array element per row, $1-$21),
-- and a record's also carries the entries before it in its chain. Those
-- are passed flattened, one array per column ($26-$36), each row's in the
-- elements lo..hi ($24, $25; hi < lo: none, a plain row).
INSERT INTO ledger_rows (
    tenant_id, seq, kind, created_at, admission_id, model, estimate, actual,
    refill_micro, delta_micro, balance_micro, period_start, period_used, late,
    actor, reason, detail, prev_hash, hash, money_micro, windows,
    lease_id, earlier_prev, earlier_kinds, earlier_admissions, earlier_models, earlier_estimates, earlier_actuals,
    earlier_refills, earlier_money, earlier_actors, earlier_reasons, earlier_details, earlier_hashes
)
SELECT r.tenant_id, r.seq, r.kind, r.created_at, r.admission_id, r.model, r.estimate, r.actual,
       r.refill_micro, r.delta_micro, r.balance_micro, r.period_start, r.period_used, r.late,
       r.actor, r.reason, r.detail, r.prev_hash, r.hash, r.money_micro, r.windows,
       CASE WHEN r.hi >= r.lo THEN r.lease_id END,
       CASE WHEN r.hi >= r.lo THEN r.earlier_prev END,
       CASE WHEN r.hi >= r.lo THEN ($26::text[])[r.lo::int4:r.hi::int4] END,
       CASE WHEN r.hi >= r.lo THEN ($27::text[])[r.lo::int4:r.hi::int4] END,
       CASE WHEN r.hi >= r.lo THEN ($28::text[])[r.lo::int4:r.hi::int4] END,
       CASE WHEN r.hi >= r.lo THEN ($29::bigint[])[r.lo::int4:r.hi::int4] END,
       CASE WHEN r.hi >= r.lo THEN ($30::bigint[])[r.lo::int4:r.hi::int4] END,
       CASE WHEN r.hi >= r.lo THEN ($31::bigint[])[r.lo::int4:r.hi::int4] END,
       CASE WHEN r.hi >= r.lo THEN ($32::bigint[])[r.lo::int4:r.hi::int4] END,
       CASE WHEN r.hi >= r.lo THEN ($33::text[])[r.lo::int4:r.hi::int4] END,
       CASE WHEN r.hi >= r.lo THEN ($34::text[])[r.lo::int4:r.hi::int4] END,
       CASE WHEN r.hi >= r.lo THEN ($35::text[])[r.lo::int4:r.hi::int4] END,
       CASE WHEN r.hi >= r.lo THEN ($36::bytea[])[r.lo::int4:r.hi::int4] END
FROM unnest(
    $1::text[], $2::bigint[], $3::text[], $4::timestamptz[], $5::text[], $6::text[], $7::bigint[], $8::bigint[],
    $9::bigint[], $10::bigint[], $11::bigint[], $12::timestamptz[], $13::bigint[], $14::boolean[],
    $15::text[], $16::text[], $17::text[], $18::bytea[], $19::bytea[], $20::bigint[], $21::text[],
    $22::text[], $23::bytea[], $24::bigint[], $25::bigint[]
) AS r (tenant_id, seq, kind, created_at, admission_id, model, estimate, actual,
        refill_micro, delta_micro, balance_micro, period_start, period_used, late,
        actor, reason, detail, prev_hash, hash, money_micro, windows,
        lease_id, earlier_prev, lo, hi)
