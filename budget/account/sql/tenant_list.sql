-- Every tenant but end users (listed by their tenant: end_user_list.sql),
-- who may be many thousands.
SELECT id, disabled_at, created_at, tokens_capacity, tokens_rate_micro, requests_capacity,
       requests_rate_micro, max_concurrent, windows, reservation_ttl_ms, tokens_micro, tokens_at,
       requests_micro, requests_at, open_reservations, window_usage, ledger_seq, ledger_hash, max_wait_ms,
       on_store_unavailable, parent_id, path, depth, shadow_limits, model_limits, end_user_of, end_user_id,
       end_user_expired_at, allowed_models
FROM tenants WHERE end_user_of IS NULL ORDER BY id
