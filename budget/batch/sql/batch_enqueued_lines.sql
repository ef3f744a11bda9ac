-- A batch's lines still enqueued, under its lock.
SELECT custom_id, model, input_tokens, output_tokens, input_weight_micro, output_weight_micro, reserved_micro, money_micro
FROM batch_lines WHERE batch_id = $1 AND state = 'enqueued' ORDER BY custom_id
