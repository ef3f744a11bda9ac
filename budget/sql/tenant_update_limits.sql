UPDATE tenants
SET tokens_capacity = $2, tokens_rate_micro = $3, requests_capacity = NULLIF($4, 0), requests_rate_micro = NULLIF($5, 0),
    max_concurrent = NULLIF($6, 0), period_budget = NULLIF($7, 0), period = NULLIF($8, ''),
    reservation_ttl_ms = $9, max_wait_ms = $10, on_store_unavailable = NULLIF($11, ''), shadow_limits = $12
WHERE id = $1
