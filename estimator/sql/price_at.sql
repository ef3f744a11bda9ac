SELECT model, service_tier, effective_from, currency, input_micro, output_micro, cached_input_micro,
       cache_write_5m_micro, cache_write_1h_micro, reasoning_output_micro, long_context_threshold,
       long_input_micro, long_output_micro, source, created_at, created_by
FROM model_prices WHERE model = $1 AND effective_from <= $2 AND service_tier = $3 ORDER BY effective_from DESC LIMIT 1
