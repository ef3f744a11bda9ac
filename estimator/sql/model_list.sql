SELECT name, encoding, input_weight_micro, output_weight_micro, default_output_tokens, context_window, part_tokens,
       updated_at, updated_by
FROM models
ORDER BY name
