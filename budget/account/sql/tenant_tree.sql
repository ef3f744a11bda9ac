-- The budget tree that holds a tenant: its root and every tenant whose
-- path starts at that root, in id order (tenants_root_idx). End users are
-- left out (they may be thousands; EndUserList pages through them), but
-- for the tenant asked for, when it is one.
WITH root AS (SELECT coalesce(path[1], id) AS id FROM tenants WHERE id = $1)
SELECT id, disabled_at, created_at, tokens_capacity, tokens_rate_micro, requests_capacity,
       requests_rate_micro, max_concurrent, windows, reservation_ttl_ms, tokens_micro, tokens_at,
       requests_micro, requests_at, open_reservations, window_usage, ledger_seq, ledger_hash, max_wait_ms,
       on_store_unavailable, parent_id, path, depth, shadow_limits, model_limits, end_user_of, end_user_id,
       end_user_expired_at, allowed_models
FROM tenants
WHERE (id = (SELECT id FROM root) OR path[1] = (SELECT id FROM root))
  AND (end_user_of IS NULL OR id = $1)
ORDER BY id
