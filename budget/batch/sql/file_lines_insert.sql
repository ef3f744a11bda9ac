-- An uploaded input file's lines, one array element per line.
INSERT INTO batch_file_lines (provider, file_id, line, custom_id, model, input_tokens, output_tokens,
                              input_weight_micro, output_weight_micro, reserved_micro, money_micro)
SELECT $1, $2, u.* FROM unnest($3::integer[], $4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::bigint[],
                              $9::bigint[], $10::bigint[], $11::bigint[]) AS u
