-- The journal rows a decision's settles and releases name, by admission
-- id ($1, named by requests of the tenants $2) or by a live
-- Idempotency-Key ($3, $4: (tenant, key) pairs), and those its reserves'
-- keys name: read in its lock round trip, without a lock (the booking
-- takes the rows again, under the tree's row locks the decision holds: a
-- row another booking took first is booked already).
--
-- Only for the tenants with a live lease (live): the decision holds their
-- rows, locked by the statement before this one, and a lease is taken only
-- under its tenant's row lock, ending one books every row of its journal.
-- So a tenant without a live lease has no journal row that is not also an
-- admissions row (and an idempotency_keys row), and this statement does not
-- read lease_admissions for it: the inner side of a nested loop over the
-- names of leased tenants only (budget/lease TestExactSkipsJournalWithoutLease).
WITH live AS MATERIALIZED (
    SELECT DISTINCT l.tenant_id
    FROM leases l
    WHERE l.state = 'live' AND l.tenant_id = ANY ($2::text[] || $3::text[])
), by_id AS MATERIALIZED (
    SELECT q.admission_id FROM unnest($1::text[], $2::text[]) AS q (admission_id, tenant_id)
    WHERE q.tenant_id IN (SELECT tenant_id FROM live)
), by_key AS MATERIALIZED (
    SELECT k.tenant_id, k.key FROM unnest($3::text[], $4::text[]) AS k (tenant_id, key)
    WHERE k.tenant_id IN (SELECT tenant_id FROM live)
)
SELECT la.lease_id, la.admission_id, coalesce(la.tenant_id, '') AS tenant_id, coalesce(la.idem_key, '') AS idem_key, false AS booked, la.admission
FROM by_id q
CROSS JOIN LATERAL (
    SELECT x.lease_id, x.admission_id, x.tenant_id, x.idem_key, x.admission
    FROM lease_admissions x WHERE x.admission_id = q.admission_id OFFSET 0) la
UNION ALL
SELECT la.lease_id, la.admission_id, la.tenant_id, la.idem_key, false, la.admission
FROM by_key k
CROSS JOIN LATERAL (
    SELECT x.lease_id, x.admission_id, x.tenant_id, x.idem_key, x.admission
    FROM lease_admissions x
    WHERE x.tenant_id = k.tenant_id AND x.idem_key = k.key
      AND x.created_at > coalesce($5::timestamptz, clock_timestamp()) - interval '24 hours'
    OFFSET 0) la
