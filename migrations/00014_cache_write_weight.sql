-- +goose Up
-- What one input token written to the provider's prompt cache costs
-- (Anthropic's cache_creation_input_tokens), in micro units like the other
-- weights: for 5 minutes (or every write when the usage does not split
-- them), and for an hour. NULL: an input token's, and for the hour the
-- 5 minute weight.
ALTER TABLE models ADD COLUMN cache_write_weight_micro bigint CHECK (cache_write_weight_micro > 0),
                   ADD COLUMN cache_write_1h_weight_micro bigint CHECK (cache_write_1h_weight_micro > 0);

-- A settle kept for an admission not replayed yet keeps its cache writes
-- too, so that it is priced as it would have been at once.
ALTER TABLE deferred_settles ADD COLUMN cache_write_tokens bigint NOT NULL DEFAULT 0 CHECK (cache_write_tokens >= 0),
                             ADD COLUMN cache_write_1h_tokens bigint NOT NULL DEFAULT 0 CHECK (cache_write_1h_tokens >= 0);

-- +goose Down
ALTER TABLE deferred_settles DROP COLUMN cache_write_tokens, DROP COLUMN cache_write_1h_tokens;
ALTER TABLE models DROP COLUMN cache_write_weight_micro, DROP COLUMN cache_write_1h_weight_micro;
