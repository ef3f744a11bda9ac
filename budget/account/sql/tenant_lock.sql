-- The tenants of a batch and all their ancestors (path is immutable, so it
-- is read without a lock), locked in one statement root first: by depth,
-- then id (LockRows runs above the sort). Every transaction takes its rows
-- in this one global order, so replicas whose batches overlap anywhere in
-- the tree cannot deadlock. One = ANY over one array (the ancestors are an
-- InitPlan, computed once) lets the primary key find every row: an OR of two
-- arrays scanned the whole table, however many tenants it holds.
SELECT * FROM tenants
WHERE id = ANY ($1::text[] || ARRAY(SELECT unnest(path) FROM tenants WHERE id = ANY($1::text[])))
ORDER BY depth, id
FOR UPDATE
