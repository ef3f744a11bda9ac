-- The journal rows a decision's settles and releases name, by admission
-- id ($1) or by a live Idempotency-Key ($2, $3: (tenant, key) pairs), and
-- those its reserves' keys name: read in its lock round trip, without a
-- lock (the booking takes the rows again, under the tree's row locks the
-- decision holds: a row another booking took first is booked already).
SELECT lease_id, admission_id, coalesce(tenant_id, '') AS tenant_id, coalesce(idem_key, '') AS idem_key, false AS booked, admission
FROM lease_admissions
WHERE admission_id = ANY ($1::text[])
UNION ALL
SELECT la.lease_id, la.admission_id, la.tenant_id, la.idem_key, false, la.admission
FROM lease_admissions la
JOIN unnest($2::text[], $3::text[]) AS k (tenant_id, key) ON la.tenant_id = k.tenant_id AND la.idem_key = k.key
WHERE la.created_at > coalesce($4::timestamptz, clock_timestamp()) - interval '24 hours'
