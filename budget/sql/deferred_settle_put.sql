-- The settles and releases of a batch that named by Idempotency-Key an
-- admission the store does not know yet (deferred_settles). Written under
-- the tenant's row lock, like the keys a replay writes, so a replay either
-- committed before (and the batch found its admission) or reads these rows
-- after. The first row of a key wins; a purged row (older than 24 h) is
-- replaced.
INSERT INTO deferred_settles (tenant_id, key, kind, input_tokens, output_tokens, cached_input_tokens, refund_tokens,
                              actor, key_id, gateway_id, created_at, cache_write_tokens, cache_write_1h_tokens,
                              reasoning_tokens)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[],
                     $8::text[], $9::text[], $10::text[], $11::timestamptz[], $12::bigint[], $13::bigint[], $14::bigint[])
ON CONFLICT (tenant_id, key) DO UPDATE
SET kind = excluded.kind, input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens,
    cached_input_tokens = excluded.cached_input_tokens, refund_tokens = excluded.refund_tokens,
    cache_write_tokens = excluded.cache_write_tokens, cache_write_1h_tokens = excluded.cache_write_1h_tokens,
    reasoning_tokens = excluded.reasoning_tokens,
    actor = excluded.actor, key_id = excluded.key_id, gateway_id = excluded.gateway_id, created_at = excluded.created_at
WHERE deferred_settles.created_at <= excluded.created_at - interval '24 hours'
