-- A batch's lines, copied from its input file's estimate.
INSERT INTO batch_lines (batch_id, custom_id, model, input_tokens, output_tokens, input_weight_micro,
                         output_weight_micro, reserved_micro, money_micro, state)
SELECT $1, custom_id, model, input_tokens, output_tokens, input_weight_micro, output_weight_micro, reserved_micro,
       money_micro, 'enqueued'
FROM batch_file_lines WHERE provider = $2 AND file_id = $3
