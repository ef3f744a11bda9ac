-- Ends a batch.
UPDATE batches SET state = 'ended', ended_at = $2, outcome = $3 WHERE id = $1 AND state = 'open'
