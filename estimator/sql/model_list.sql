SELECT name, encoding, input_weight_micro, output_weight_micro, default_output_tokens, context_window,
       part_tokens, updated_at, updated_by, on_store_unavailable, cached_input_weight_micro,
       cache_write_weight_micro, cache_write_1h_weight_micro
FROM models ORDER BY name
