-- The journal rows of a lease that the ledger does not record yet, in the
-- order they were journaled. The lease row is locked, so none is in flight.
SELECT admission_id, model, cost, cost_micro, money_micro, created_at, coalesce(idem_key, ''), admission
FROM lease_admissions
WHERE lease_id = $1 AND NOT booked
ORDER BY seq
