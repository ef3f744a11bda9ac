INSERT INTO tenants (
    id, tokens_capacity, tokens_rate_micro, requests_capacity, requests_rate_micro,
    max_concurrent, windows, reservation_ttl_ms, max_wait_ms,
    tokens_micro, tokens_at, requests_micro, requests_at, created_at, on_store_unavailable,
    shadow_limits, parent_id, path, depth, end_user_of, end_user_id
) VALUES (
    $1, $2, $3, NULLIF($4, 0), NULLIF($5, 0),
    NULLIF($6, 0), $7::jsonb, $8, $9,
    $10, $11, $12, $13, $11, NULLIF($14, ''),
    $15, NULLIF($16, ''), $17, cardinality($17::text[]), NULLIF($18, ''), NULLIF($19, '')
)
ON CONFLICT (id) DO NOTHING
RETURNING ledger_seq
