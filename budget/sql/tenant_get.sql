SELECT id, disabled_at IS NOT NULL,
       tokens_capacity, tokens_rate_micro, coalesce(requests_capacity, 0), coalesce(requests_rate_micro, 0),
       coalesce(max_concurrent, 0), coalesce(period_budget, 0), coalesce(period, ''), reservation_ttl_ms, max_wait_ms, coalesce(on_store_unavailable, ''),
       tokens_micro, tokens_at, requests_micro, requests_at, open_reservations, period_start, period_used,
       ledger_seq, ledger_hash
FROM tenants
WHERE id = $1
