-- The model limits of a batch's tenants and their ancestors. Read after
-- the tenant rows are locked: every writer of a row holds its tenant's
-- lock, so this read is current without a lock of its own.
SELECT * FROM tenant_model_limits
WHERE tenant_id = ANY($1::text[])
   OR tenant_id = ANY (ARRAY(SELECT unnest(path) FROM tenants WHERE id = ANY($1::text[])))
