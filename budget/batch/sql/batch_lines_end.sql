-- Ends a batch's lines, one array element per line.
UPDATE batch_lines l SET state = u.state, outcome = u.outcome, actual_input = u.actual_input,
                         actual_output = u.actual_output, actual_micro = u.actual_micro,
                         actual_money_micro = u.actual_money_micro, actual_cache_read = u.cache_read,
                         actual_cache_write = u.cache_write, actual_cache_write_1h = u.cache_write_1h
FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[],
            $9::bigint[], $10::bigint[], $11::bigint[])
     AS u (custom_id, state, outcome, actual_input, actual_output, actual_micro, actual_money_micro, cache_read,
           cache_write, cache_write_1h)
WHERE l.batch_id = $1 AND l.custom_id = u.custom_id AND l.state = 'enqueued'
