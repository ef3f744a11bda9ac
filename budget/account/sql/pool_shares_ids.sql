SELECT pool_id, tenant_id, weight, vtc_micro, served, active_at
FROM pool_shares WHERE pool_id = ANY($1::text[])
