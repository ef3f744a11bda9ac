INSERT INTO models (name, encoding, input_weight_micro, output_weight_micro, default_output_tokens, context_window,
                    part_tokens, updated_by, on_store_unavailable, cached_input_weight_micro,
                    cache_write_weight_micro, cache_write_1h_weight_micro)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULLIF($9, ''), $10, $11, $12)
