-- Ends a batch's lines, one array element per line.
UPDATE batch_lines l SET state = u.state, outcome = u.outcome, actual_input = u.actual_input,
                         actual_output = u.actual_output, actual_micro = u.actual_micro
FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[])
     AS u (custom_id, state, outcome, actual_input, actual_output, actual_micro)
WHERE l.batch_id = $1 AND l.custom_id = u.custom_id AND l.state = 'enqueued'
