-- The model limits of a batch's tenants and their ancestors. A statement of
-- its own after the tenant rows are locked, so it reads with a snapshot
-- taken after the locks (a sub-select in the lock statement would read the
-- snapshot from before its wait): every writer of a row holds its tenant's
-- lock, so this read is current without a lock of its own.
SELECT tenant_id, model, input_capacity, input_rate_micro, output_capacity, output_rate_micro, input_micro,
       input_at, output_micro, output_at, shadow_limits
FROM tenant_model_limits
WHERE tenant_id = ANY($1::text[])
   OR tenant_id = ANY (ARRAY(SELECT unnest(path) FROM tenants WHERE id = ANY($1::text[])))
