-- A batch's lines given with it (Anthropic's requests), one array element per line.
INSERT INTO batch_lines (batch_id, custom_id, model, input_tokens, output_tokens, input_weight_micro,
                         output_weight_micro, reserved_micro, money_micro, state)
SELECT $1, u.*, 'enqueued' FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[],
                                       $7::bigint[], $8::bigint[], $9::bigint[]) AS u
