-- A lease renewed: a new slice and expiry. Its journal is booked apart
-- (lease_unbooked.sql), so used_micro, which the group commits move, is
-- not read here.
UPDATE leases SET slice_micro = $2, renewed_at = $3, expires_at = $4
WHERE id = $1
