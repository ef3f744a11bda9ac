-- +goose Up
-- Service tiers (issue 38): a model's price depends on the tier it was
-- served at (flex about half the default price, priority about double,
-- batch half), so price rows are keyed by tier. Every row stored so far
-- prices the default tier. A tier with no row of its own is priced at the
-- default tier's row (estimator.PriceBook.AtTier). Adding a column with a
-- constant default rewrites no row, so the append-only trigger does not
-- fire.
ALTER TABLE model_prices ADD COLUMN service_tier text NOT NULL DEFAULT 'default'
    CHECK (service_tier IN ('default', 'flex', 'priority', 'batch'));
ALTER TABLE model_prices DROP CONSTRAINT model_prices_pkey;
ALTER TABLE model_prices ADD PRIMARY KEY (model, service_tier, effective_from);

-- The tier of the price row an admission was reserved at (with price_model
-- and price_from, its row's key; NULL: default, as for every admission
-- made before tiers). Its settle charges the tier the upstream reported,
-- at the row of that tier in effect when it was reserved, and this one
-- when the usage names no tier.
ALTER TABLE admissions ADD COLUMN price_tier text;

-- A settle kept for an admission not replayed yet keeps the tier its usage
-- reported ('' for none).
ALTER TABLE deferred_settles ADD COLUMN service_tier text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE deferred_settles DROP COLUMN service_tier;
ALTER TABLE admissions DROP COLUMN price_tier;
ALTER TABLE model_prices DROP CONSTRAINT model_prices_pkey;
ALTER TABLE model_prices DISABLE TRIGGER model_prices_no_update_delete;
DELETE FROM model_prices WHERE service_tier <> 'default';
ALTER TABLE model_prices ENABLE TRIGGER model_prices_no_update_delete;
ALTER TABLE model_prices DROP COLUMN service_tier;
ALTER TABLE model_prices ADD PRIMARY KEY (model, effective_from);
