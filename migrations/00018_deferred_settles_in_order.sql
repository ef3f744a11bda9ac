-- +goose Up
-- Every settle and release kept for a key, in the order they came, not
-- only the first: the replay applies the first the decision accepts, as
-- the live path would have (a settle with usage out of the admission's
-- bounds is refused and moves nothing, and the next one settles). With
-- only the first kept, a stream end with impossible usage that happened to
-- arrive first, answered OK because nothing could be checked yet, made the
-- real one be dropped, and the reservation expired at its estimate (found
-- by the soak on Patroni). A key keeps at most 8 (deferred_settle_put.sql).
ALTER TABLE deferred_settles ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY;
ALTER TABLE deferred_settles DROP CONSTRAINT deferred_settles_pkey;
ALTER TABLE deferred_settles ADD PRIMARY KEY (tenant_id, key, seq);

-- +goose Down
DELETE FROM deferred_settles d
WHERE EXISTS (SELECT 1 FROM deferred_settles e WHERE e.tenant_id = d.tenant_id AND e.key = d.key AND e.seq < d.seq);
ALTER TABLE deferred_settles DROP CONSTRAINT deferred_settles_pkey;
ALTER TABLE deferred_settles DROP COLUMN seq;
ALTER TABLE deferred_settles ADD PRIMARY KEY (tenant_id, key);
