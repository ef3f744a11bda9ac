UPDATE tenants
SET tokens_capacity = $2, tokens_rate_micro = $3, requests_capacity = NULLIF($4, 0), requests_rate_micro = NULLIF($5, 0),
    max_concurrent = NULLIF($6, 0), windows = $7::jsonb, reservation_ttl_ms = $8, max_wait_ms = $9,
    on_store_unavailable = NULLIF($10, ''), shadow_limits = $11
WHERE id = $1
