INSERT INTO pool_shares (pool_id, tenant_id, weight, vtc_micro, served, active_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::integer[], $4::bigint[], $5::bigint[], $6::timestamptz[])
ON CONFLICT (pool_id, tenant_id) DO UPDATE
SET vtc_micro = excluded.vtc_micro, served = excluded.served, active_at = excluded.active_at
