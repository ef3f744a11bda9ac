-- An end user's row, locked after its tenant's (one depth below: the
-- global lock order). A statement of its own, after the tenant's lock is
-- held, so that it sees a row another transaction inserted while this one
-- waited for that lock (the lock statement's snapshot predates it).
SELECT id, disabled_at, created_at, tokens_capacity, tokens_rate_micro, requests_capacity,
       requests_rate_micro, max_concurrent, windows, reservation_ttl_ms, tokens_micro, tokens_at,
       requests_micro, requests_at, open_reservations, window_usage, ledger_seq, ledger_hash, max_wait_ms,
       on_store_unavailable, parent_id, path, depth, shadow_limits, model_limits, end_user_of, end_user_id,
       end_user_expired_at, allowed_models
FROM tenants WHERE id = $1 FOR UPDATE
