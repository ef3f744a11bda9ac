-- +goose Up
-- Less written per admission (docs/leasing.md, item 5; BENCHMARKS.md,
-- "Quota leasing, fourth step"). Every admission inserts an admissions row
-- and, keyed (the rate limit service keys every request), an
-- idempotency_keys row; each B-tree index on them is an entry, its WAL and
-- its page splits, in the decision's or the journal group's transaction.
-- Two of them index created_at alone, for reads that want a range of time
-- and never an order or one row:
--
-- - admissions_created_idx: the drift report over every tenant
--   (drift_report.sql with no tenant: created_at in [from, to)); a tenant's
--   own reads keep admissions_tenant_created_idx.
-- - idempotency_keys_created_idx: the purge of keys older than 24 h
--   (idempotency_purge.sql).
--
-- Both tables are appended to in time order (created_at is the store's
-- clock at the insert), so a block range index summarizes them tightly: a
-- range of time is a few ranges of pages, read as a bitmap. A BRIN index
-- is written only when a page range is summarized (autovacuum, or
-- autosummarize as a range fills), not per row. An out-of-order row (an
-- expired key replaced, a frozen clock in tests) only widens its range's
-- summary: the reads stay right, a little less selective.
DROP INDEX admissions_created_idx;
CREATE INDEX admissions_created_brin ON admissions USING brin (created_at) WITH (autosummarize = on);
DROP INDEX idempotency_keys_created_idx;
CREATE INDEX idempotency_keys_created_brin ON idempotency_keys USING brin (created_at) WITH (autosummarize = on);

-- +goose Down
DROP INDEX idempotency_keys_created_brin;
CREATE INDEX idempotency_keys_created_idx ON idempotency_keys (created_at);
DROP INDEX admissions_created_brin;
CREATE INDEX admissions_created_idx ON admissions (created_at);
