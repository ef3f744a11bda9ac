-- A price takes effect at $3, or at once when $3 is NULL; never in the
-- past (no row when $3 is before now), so history is never rewritten.
INSERT INTO model_prices (model, service_tier, effective_from, currency, input_micro, output_micro, cached_input_micro,
                          cache_write_5m_micro, cache_write_1h_micro, reasoning_output_micro,
                          long_context_threshold, long_input_micro, long_output_micro, source, created_by)
SELECT $1, $2, coalesce($3, clock_timestamp()), $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15
WHERE coalesce($3, clock_timestamp()) >= now()
RETURNING model, service_tier, effective_from, currency, input_micro, output_micro, cached_input_micro,
       cache_write_5m_micro, cache_write_1h_micro, reasoning_output_micro, long_context_threshold,
       long_input_micro, long_output_micro, source, created_at, created_by
