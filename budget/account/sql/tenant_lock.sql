-- The tenants of a batch and all their ancestors (path is immutable, so it
-- is read without a lock), locked in one statement root first: by depth,
-- then id (LockRows runs above the sort). Every transaction takes its rows
-- in this one global order, so replicas whose batches overlap anywhere in
-- the tree cannot deadlock. One = ANY over one array (the ancestors are an
-- InitPlan, computed once) lets the primary key find every row: an OR of two
-- arrays scanned the whole table, however many tenants it holds.
SELECT id, disabled_at, created_at, tokens_capacity, tokens_rate_micro, requests_capacity,
       requests_rate_micro, max_concurrent, windows, reservation_ttl_ms, tokens_micro, tokens_at,
       requests_micro, requests_at, open_reservations, window_usage, ledger_seq, ledger_hash, max_wait_ms,
       on_store_unavailable, parent_id, path, depth, shadow_limits, model_limits, end_user_of, end_user_id,
       end_user_expired_at, allowed_models
FROM tenants
WHERE id = ANY ($1::text[] || ARRAY(SELECT unnest(path) FROM tenants WHERE id = ANY($1::text[])))
ORDER BY depth, id
FOR UPDATE
