-- Ends a batch.
UPDATE batches SET state = 'ended', ended_at = $2, outcome = $3, output_files = $4 WHERE id = $1 AND state = 'open'
