-- An end user's row, locked after its tenant's (one depth below: the
-- global lock order). A statement of its own, after the tenant's lock is
-- held, so that it sees a row another transaction inserted while this one
-- waited for that lock (the lock statement's snapshot predates it).
SELECT * FROM tenants WHERE id = $1 FOR UPDATE
