-- A lease's journal rows taken for booking, up to $2 of them in the order
-- journaled, deleted as they are read: once booked, each is its admissions
-- row, its Idempotency-Key row and its ledger entries
-- (00032_lease_journal_lighter.sql). A row a group commit has not
-- committed yet is not seen, and is booked by the next booking; two
-- bookings of one lease are ordered by its tree's row locks, which both
-- hold. The rows come back unordered: the caller sorts them by seq.
DELETE FROM lease_admissions
WHERE lease_id = $1
  AND seq IN (SELECT seq FROM lease_admissions WHERE lease_id = $1 ORDER BY seq LIMIT $2)
RETURNING seq, admission_id, model, cost, cost_micro, money_micro, created_at, coalesce(idem_key, ''), admission
