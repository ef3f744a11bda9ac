-- A group commit's admissions of one lease, in one statement.
INSERT INTO lease_admissions (lease_id, admission_id, model, cost, cost_micro, money_micro, created_at)
SELECT $1, u.id, u.model, u.cost, u.cost_micro, u.money_micro, coalesce($7::timestamptz, clock_timestamp())
FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[]) AS u (id, model, cost, cost_micro, money_micro)
