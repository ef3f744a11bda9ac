-- The lines of a recorded input file, with their models, in order.
SELECT line, custom_id, model FROM batch_file_lines WHERE provider = $1 AND file_id = $2 ORDER BY line
