-- Entries of one transaction, one array per column (one element per
-- entry): a batch of decisions appends all its entries in one statement.
INSERT INTO ledger_rows (
    tenant_id, seq, kind, created_at, admission_id, model, estimate, actual,
    refill_micro, delta_micro, balance_micro, period_start, period_used, late,
    actor, reason, detail, prev_hash, hash, money_micro, windows
)
SELECT * FROM unnest(
    $1::text[], $2::bigint[], $3::text[], $4::timestamptz[], $5::text[], $6::text[], $7::bigint[], $8::bigint[],
    $9::bigint[], $10::bigint[], $11::bigint[], $12::timestamptz[], $13::bigint[], $14::boolean[],
    $15::text[], $16::text[], $17::text[], $18::bytea[], $19::bytea[], $20::bigint[], $21::text[]
)
