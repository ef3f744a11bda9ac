-- The model buckets a batch changed, one array element per bucket pair.
UPDATE tenant_model_limits m
SET input_micro = u.input_micro, input_at = u.input_at, output_micro = u.output_micro, output_at = u.output_at
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::timestamptz[], $5::bigint[], $6::timestamptz[])
     AS u (tenant_id, model, input_micro, input_at, output_micro, output_at)
WHERE m.tenant_id = u.tenant_id AND m.model = u.model
