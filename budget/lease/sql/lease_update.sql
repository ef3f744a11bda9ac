-- A lease reconciled (booked = used, its journal is in the ledger), and
-- renewed ($2 live, a new slice and expiry) or ended ($2 returned or
-- expired, ended_at set).
UPDATE leases
SET state = $2, slice_micro = $3, booked_micro = used_micro, renewed_at = $4, expires_at = $5, ended_at = $6
WHERE id = $1
