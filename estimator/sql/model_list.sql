SELECT name, encoding, input_weight_micro, output_weight_micro, default_output_tokens, context_window, part_tokens,
       coalesce(on_store_unavailable, ''), updated_at, updated_by
FROM models
ORDER BY name
