-- How many live, unexpired leases a tenant has (one per replica holding
-- it): the R of the slice's cap (Store.Holders).
SELECT count(*) FROM leases
WHERE tenant_id = $1 AND state = 'live' AND expires_at > coalesce($2::timestamptz, clock_timestamp())
