-- The settles and releases kept for a replayed admission's key, in the
-- order they came, if any came first and are not older than 24 h. Read
-- after the tenant's row lock, under which every such row is written, so
-- they are current.
SELECT kind, input_tokens, output_tokens, cached_input_tokens, refund_tokens, actor, created_at, cache_write_tokens,
       cache_write_1h_tokens, reasoning_tokens, service_tier
FROM deferred_settles
WHERE tenant_id = $1 AND key = $2 AND created_at > coalesce($3::timestamptz, clock_timestamp()) - interval '24 hours'
ORDER BY seq
LIMIT 8
