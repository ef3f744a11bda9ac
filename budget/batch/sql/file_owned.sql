-- Whether a file of the upstream is a tenant's: an input file it uploaded,
-- or an output or error file of one of its batches.
SELECT EXISTS (SELECT 1 FROM batch_files WHERE provider = $1 AND id = $2 AND tenant_id = $3)
    OR EXISTS (SELECT 1 FROM batches WHERE provider = $1 AND tenant_id = $3 AND $2 = ANY (output_files))
