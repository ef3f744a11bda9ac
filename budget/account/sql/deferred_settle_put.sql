-- The settles and releases of a batch that named by Idempotency-Key an
-- admission the store does not know yet (deferred_settles), in the order
-- the batch decided them. Written under the tenant's row lock, like the
-- keys a replay writes, so a replay either committed before (and the batch
-- found its admission) or reads these rows after. Every one is kept, in
-- order (seq), up to 8 per key within the idempotency window (the rows of
-- this statement are not counted here: the batch keeps at most 8 of a key): the replay
-- applies the first the decision accepts. Rows older than 24 h are
-- ignored here as by the replay, and purged by the sweep.
INSERT INTO deferred_settles (tenant_id, key, kind, input_tokens, output_tokens, cached_input_tokens, refund_tokens,
                              actor, key_id, gateway_id, created_at, cache_write_tokens, cache_write_1h_tokens,
                              reasoning_tokens, service_tier)
SELECT u.tenant_id, u.key, u.kind, u.input_tokens, u.output_tokens, u.cached_input_tokens, u.refund_tokens,
       u.actor, u.key_id, u.gateway_id, u.created_at, u.cache_write_tokens, u.cache_write_1h_tokens, u.reasoning_tokens, u.service_tier
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[],
            $8::text[], $9::text[], $10::text[], $11::timestamptz[], $12::bigint[], $13::bigint[], $14::bigint[], $15::text[])
         WITH ORDINALITY AS u (tenant_id, key, kind, input_tokens, output_tokens, cached_input_tokens, refund_tokens,
                               actor, key_id, gateway_id, created_at, cache_write_tokens, cache_write_1h_tokens,
                               reasoning_tokens, service_tier, n)
WHERE (SELECT count(*) FROM deferred_settles d
       WHERE d.tenant_id = u.tenant_id AND d.key = u.key AND d.created_at > u.created_at - interval '24 hours') < 8
ORDER BY u.n
