-- A group commit's admissions, of all its leases, in one statement.
-- tenant_id and idem_key (the Idempotency-Key as stored, NULL for none)
-- are what the replays look rows up by; admission is the admissions row
-- the booking writes (JSON: 00031_lease_admissions_full.sql).
INSERT INTO lease_admissions (lease_id, admission_id, model, cost, cost_micro, money_micro, created_at, tenant_id, idem_key, admission)
SELECT u.lease_id, u.id, u.model, u.cost, u.cost_micro, u.money_micro, coalesce($7::timestamptz, clock_timestamp()),
       u.tenant_id, nullif(u.idem_key, ''), u.admission::json
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $8::text[], $9::text[], $10::text[])
     WITH ORDINALITY AS u (lease_id, id, model, cost, cost_micro, money_micro, tenant_id, idem_key, admission, n)
ORDER BY u.n
