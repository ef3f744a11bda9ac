-- The tenants of a batch, locked in id order in one statement (LockRows
-- runs above the sort): replicas whose batches overlap cannot deadlock.
SELECT * FROM tenants WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE
