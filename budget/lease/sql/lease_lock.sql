-- A lease, locked after its tenant's rows (the one lock order: tenants,
-- then the lease), so that no journal write of it runs while it is
-- reconciled, renewed, returned or expired.
SELECT tenant_id, state, slice_micro, used_micro, booked_micro, expires_at
FROM leases WHERE id = $1
FOR UPDATE
