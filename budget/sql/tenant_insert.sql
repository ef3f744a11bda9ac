INSERT INTO tenants (
    id, tokens_capacity, tokens_rate_micro, requests_capacity, requests_rate_micro,
    max_concurrent, period_budget, period, reservation_ttl_ms, max_wait_ms,
    tokens_micro, tokens_at, requests_micro, requests_at, created_at, on_store_unavailable,
    shadow_limits, parent_id, path, depth, end_user_of, end_user_id
) VALUES (
    $1, $2, $3, NULLIF($4, 0), NULLIF($5, 0),
    NULLIF($6, 0), NULLIF($7, 0), NULLIF($8, ''), $9, $10,
    $11, $12, $13, $14, $12, NULLIF($15, ''),
    $16, NULLIF($17, ''), $18, cardinality($18::text[]), NULLIF($19, ''), NULLIF($20, '')
)
ON CONFLICT (id) DO NOTHING
RETURNING ledger_seq
