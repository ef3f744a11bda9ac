-- A batch's lines as they stand, by custom_id.
SELECT custom_id, model, reserved_micro, state, coalesce(outcome, ''), coalesce(actual_input, 0), coalesce(actual_output, 0),
       coalesce(actual_micro, 0)
FROM batch_lines WHERE batch_id = $1 ORDER BY custom_id
