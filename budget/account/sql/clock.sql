-- The decision's time: the database's clock, read after the tenant row is
-- locked, unless a test froze it ($1).
SELECT coalesce($1::timestamptz, clock_timestamp())
