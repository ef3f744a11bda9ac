-- +goose Up
-- What a model costs in money, from effective_from on: prices in
-- micro-units of the deployment's one currency per million tokens
-- (1.25 USD per million tokens is 1250000). A price change is a new row
-- with a later effective_from, never an edit, so the price any past moment
-- was charged at can always be read back (estimator.PriceAt).
CREATE TABLE model_prices (
    model                  text        NOT NULL CHECK (model <> '' AND length(model) <= 256),
    effective_from         timestamptz NOT NULL,
    currency               text        NOT NULL DEFAULT 'USD' CHECK (currency ~ '^[A-Z]{3}$'),
    input_micro            bigint      NOT NULL CHECK (input_micro >= 0),
    output_micro           bigint      NOT NULL CHECK (output_micro >= 0),
    -- NULL: as an input token.
    cached_input_micro     bigint      CHECK (cached_input_micro >= 0),
    -- NULL: as an input token; for the hour, as the 5 minute write.
    cache_write_5m_micro   bigint      CHECK (cache_write_5m_micro >= 0),
    cache_write_1h_micro   bigint      CHECK (cache_write_1h_micro >= 0),
    -- NULL: reasoning tokens are priced as output tokens.
    reasoning_output_micro bigint      CHECK (reasoning_output_micro >= 0),
    -- A request whose input exceeds long_context_threshold tokens is priced
    -- at the long-context prices (all three set, or none).
    long_context_threshold bigint      CHECK (long_context_threshold > 0),
    long_input_micro       bigint      CHECK (long_input_micro >= 0),
    long_output_micro      bigint      CHECK (long_output_micro >= 0),
    source                 text        NOT NULL DEFAULT '',
    created_at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    created_by             text        NOT NULL,
    PRIMARY KEY (model, effective_from),
    CHECK ((long_context_threshold IS NULL) = (long_input_micro IS NULL)
       AND (long_context_threshold IS NULL) = (long_output_micro IS NULL))
);

-- +goose StatementBegin
CREATE FUNCTION model_prices_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'model_prices is append-only: % is not allowed (a price change is a new row with a later effective_from)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER model_prices_no_update_delete
    BEFORE UPDATE OR DELETE ON model_prices
    FOR EACH ROW EXECUTE FUNCTION model_prices_append_only();
CREATE TRIGGER model_prices_no_truncate
    BEFORE TRUNCATE ON model_prices
    FOR EACH STATEMENT EXECUTE FUNCTION model_prices_append_only();

-- One currency per deployment: the first row sets it, and a row in another
-- currency is refused, so sums of prices never mix currencies.
-- +goose StatementBegin
CREATE FUNCTION model_prices_one_currency() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM model_prices WHERE currency <> NEW.currency) THEN
        RAISE EXCEPTION 'model_prices holds prices in another currency than %', NEW.currency
            USING ERRCODE = 'check_violation', COLUMN = 'currency';
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER model_prices_currency
    BEFORE INSERT ON model_prices
    FOR EACH ROW EXECUTE FUNCTION model_prices_one_currency();

-- +goose Down
DROP TABLE model_prices;
DROP FUNCTION model_prices_one_currency();
DROP FUNCTION model_prices_append_only();
