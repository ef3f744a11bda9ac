SELECT p.id, p.tokens_capacity, p.tokens_rate_micro, p.tokens_micro, p.tokens_at, p.created_at, coalesce($1::timestamptz, clock_timestamp()) AS now,
       coalesce((SELECT array_agg(model ORDER BY model) FROM pool_models m WHERE m.pool_id = p.id), '{}') AS models,
       coalesce((SELECT array_agg(s.tenant_id || ' ' || s.weight || ' ' || s.vtc_micro || ' ' || s.served ORDER BY s.tenant_id)
                 FROM pool_shares s WHERE s.pool_id = p.id), '{}') AS shares
FROM pools p
ORDER BY p.id
