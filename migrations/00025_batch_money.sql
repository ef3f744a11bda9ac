-- +goose Up
-- Batch money (issue 38): a batch line is priced in money at the batch
-- tier (the model's 'batch' row, else its default row at the providers'
-- batch discount, estimator.PriceBook.AtBatch), and that money counts in
-- the tenant's money windows like an admission's: reserved with the
-- batch, corrected line by line as lines settle or are refunded. NULL
-- money: the line's model had no price (no window counts it).
ALTER TABLE batch_file_lines ADD COLUMN money_micro bigint CHECK (money_micro >= 0);
ALTER TABLE batch_lines ADD COLUMN money_micro bigint CHECK (money_micro >= 0);
ALTER TABLE batch_lines ADD COLUMN actual_money_micro bigint;
-- A settled line's cached input (reads, and writes for 5 minutes and an
-- hour), part of actual_input, priced at the cached weights and prices.
ALTER TABLE batch_lines ADD COLUMN actual_cache_read bigint;
ALTER TABLE batch_lines ADD COLUMN actual_cache_write bigint;
ALTER TABLE batch_lines ADD COLUMN actual_cache_write_1h bigint;
-- The batch's whole money reservation, in the deployment's currency.
ALTER TABLE batches ADD COLUMN money_micro bigint NOT NULL DEFAULT 0 CHECK (money_micro >= 0);

-- The sweeper purges batch files: an input file never used by a batch
-- after a while, any other once the batches made of it ended long ago.
CREATE INDEX batch_files_created_idx ON batch_files (created_at);
CREATE INDEX batches_file_idx ON batches (provider, file_id);

-- +goose Down
DROP INDEX batches_file_idx;
DROP INDEX batch_files_created_idx;
ALTER TABLE batches DROP COLUMN money_micro;
ALTER TABLE batch_lines DROP COLUMN actual_cache_write_1h;
ALTER TABLE batch_lines DROP COLUMN actual_cache_write;
ALTER TABLE batch_lines DROP COLUMN actual_cache_read;
ALTER TABLE batch_lines DROP COLUMN actual_money_micro;
ALTER TABLE batch_lines DROP COLUMN money_micro;
ALTER TABLE batch_file_lines DROP COLUMN money_micro;
