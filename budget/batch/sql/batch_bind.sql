-- The upstream's id of a batch it accepted.
UPDATE batches SET upstream_id = $2 WHERE id = $1 AND upstream_id IS NULL
