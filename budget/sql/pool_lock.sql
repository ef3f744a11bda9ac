-- The pools of a batch, locked after its tenants and admissions (the one
-- global lock order: tenants, admissions, pools), in id order: those the
-- reserves' models route to, and those the ended admissions drew on.
SELECT * FROM pools
WHERE id = ANY($1::text[])
   OR id IN (SELECT pool_id FROM admissions WHERE id = ANY($2::text[]) AND pool_id IS NOT NULL)
ORDER BY id
FOR UPDATE
