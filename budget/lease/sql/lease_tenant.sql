-- A lease's tenant, read without a lock (it never changes), so that its
-- tree can be locked before the lease row.
SELECT tenant_id FROM leases WHERE id = $1
