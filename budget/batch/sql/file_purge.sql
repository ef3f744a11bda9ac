-- Purges batch file records past their retention (their lines go with
-- them, ON DELETE CASCADE): a file no batch was made of, uploaded before
-- $1; a file batches were made of, all of them ended before $2. At most $3.
DELETE FROM batch_files f
WHERE (f.provider, f.id) IN (
    SELECT c.provider, c.id FROM batch_files c
    WHERE CASE WHEN EXISTS (SELECT 1 FROM batches b WHERE b.provider = c.provider AND b.file_id = c.id)
               THEN NOT EXISTS (SELECT 1 FROM batches b WHERE b.provider = c.provider AND b.file_id = c.id
                                                          AND (b.state = 'open' OR b.ended_at >= $2))
               ELSE c.created_at < $1 END
    LIMIT $3)
