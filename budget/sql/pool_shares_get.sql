-- The shares of the pools just locked (written only under their lock).
SELECT * FROM pool_shares
WHERE pool_id = ANY($1::text[])
   OR pool_id IN (SELECT pool_id FROM admissions WHERE id = ANY($2::text[]) AND pool_id IS NOT NULL)
