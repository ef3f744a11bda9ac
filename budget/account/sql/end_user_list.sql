-- A page of a tenant's end users, by tenant id (tenants_end_user_idx finds
-- them; the page is sorted by id after).
SELECT id, disabled_at, created_at, tokens_capacity, tokens_rate_micro, requests_capacity,
       requests_rate_micro, max_concurrent, windows, reservation_ttl_ms, tokens_micro, tokens_at,
       requests_micro, requests_at, open_reservations, window_usage, ledger_seq, ledger_hash, max_wait_ms,
       on_store_unavailable, parent_id, path, depth, shadow_limits, model_limits, end_user_of, end_user_id,
       end_user_expired_at, allowed_models
FROM tenants WHERE end_user_of = $1 AND id > $2 ORDER BY id LIMIT $3
