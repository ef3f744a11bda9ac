-- A lease's tenant, read without a lock (it never changes), so that its
-- tree can be locked before the lease row, and whether its journal holds
-- rows to book (a renew with none skips its booking transaction).
SELECT tenant_id, EXISTS (SELECT 1 FROM lease_admissions WHERE lease_id = $1)
FROM leases WHERE id = $1
