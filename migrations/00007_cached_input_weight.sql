-- +goose Up
-- What one cached input token costs (prompt caching), in micro units like
-- the other weights. NULL: the same as an input token.
ALTER TABLE models ADD COLUMN cached_input_weight_micro bigint CHECK (cached_input_weight_micro > 0);

-- +goose Down
ALTER TABLE models DROP COLUMN cached_input_weight_micro;
