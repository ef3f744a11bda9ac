SELECT model, service_tier, effective_from, currency, input_micro, output_micro, cached_input_micro,
       cache_write_5m_micro, cache_write_1h_micro, reasoning_output_micro, long_context_threshold,
       long_input_micro, long_output_micro, source, created_at, created_by
FROM model_prices ORDER BY model, effective_from
