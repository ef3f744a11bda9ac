-- +goose Up
-- Budgets as finance and product teams set them (issue 25).
--
-- Windows: a tenant has up to 8 calendar windows (hour, day, week, month in
-- its IANA zone, counting tokens or money), in `windows` as the API spells
-- them (budget.WindowJSON), and what each has used in `window_usage`, by
-- window name. Both live in the tenant's row, so a decision reads and
-- writes them under the one row lock it already takes, and a tenant with
-- no windows carries two NULLs. Today's period budget (period_budget per
-- UTC day or month) becomes the window named "period": same span, same
-- usage, same limit.
ALTER TABLE tenants
    ADD COLUMN windows jsonb CHECK (windows IS NULL OR jsonb_typeof(windows) = 'array'),
    ADD COLUMN window_usage jsonb CHECK (window_usage IS NULL OR jsonb_typeof(window_usage) = 'array');
UPDATE tenants
SET windows = jsonb_build_array(jsonb_build_object(
        'name', 'period', 'unit', period, 'time_zone', 'UTC', 'reset_at', '00:00', 'tokens', period_budget)),
    window_usage = CASE WHEN period_start IS NULL THEN NULL
        ELSE jsonb_build_array(jsonb_build_object('name', 'period', 'start', period_start, 'used', period_used)) END
WHERE period IS NOT NULL;
ALTER TABLE tenants
    DROP COLUMN period_budget,
    DROP COLUMN period,
    DROP COLUMN period_start,
    DROP COLUMN period_used;

-- Money: an admission records the price it was reserved at (the row of
-- model_prices: its model key and effective_from) and the money of its
-- estimate; its end records the money of its actual usage, at that same
-- price, whatever price took effect since. NULL: the model had no price.
-- The decision computes all four together from one price row; like the
-- hot path's references (migration 13), they hold by construction and
-- carry no per-row CHECK.
ALTER TABLE admissions
    ADD COLUMN price_model text,
    ADD COLUMN price_from timestamptz,
    ADD COLUMN money_estimate bigint,
    ADD COLUMN money_actual bigint;

-- A settle kept for an admission not replayed yet keeps its reasoning
-- tokens, which money prices apart for some models.
ALTER TABLE deferred_settles ADD COLUMN reasoning_tokens bigint NOT NULL DEFAULT 0 CHECK (reasoning_tokens >= 0);

-- Every ledger entry records the money it moved next to the tokens
-- (money_micro, micro-units of the deployment's currency: the estimate's at
-- reserve, actual - estimate at settle, - estimate at release), and the
-- usage of each window after it (`windows`: "name=used" pairs, by window
-- order). Entries written before (both NULL) hash as they always did; an
-- entry with either appends them to its canonical bytes, so the chain
-- covers them.
ALTER TABLE ledger_entries
    ADD COLUMN money_micro bigint,
    ADD COLUMN windows text;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ledger_canonical(e ledger_entries) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ledger_field('tokengate-ledger-v1')
    || ledger_field(e.tenant_id)
    || ledger_field(e.seq::text)
    || ledger_field(e.kind)
    || ledger_field(ledger_micros(e.created_at))
    || ledger_field(coalesce(e.admission_id, ''))
    || ledger_field(coalesce(e.model, ''))
    || coalesce(ledger_field(e.estimate::text), '\x7e'::bytea)
    || coalesce(ledger_field(e.actual::text), '\x7e'::bytea)
    || ledger_field(e.refill_micro::text)
    || ledger_field(e.delta_micro::text)
    || ledger_field(e.balance_micro::text)
    || coalesce(ledger_field(ledger_micros(e.period_start)), '\x7e'::bytea)
    || ledger_field(e.period_used::text)
    || ledger_field(CASE WHEN e.late THEN '1' ELSE '0' END)
    || ledger_field(e.actor)
    || ledger_field(coalesce(e.reason, ''))
    || ledger_field(coalesce(e.detail, ''))
    || CASE WHEN e.money_micro IS NULL AND e.windows IS NULL THEN '\x'::bytea
            ELSE ledger_field('v2')
                 || coalesce(ledger_field(e.money_micro::text), '\x7e'::bytea)
                 || coalesce(ledger_field(e.windows), '\x7e'::bytea) END $$;
-- +goose StatementEnd

-- The price book's version: every statement that adds prices bumps it, in
-- its own transaction (the row lock orders concurrent adders, so the
-- committed version only grows, in commit order). A decision reads it with
-- its clock, in the round trip it already makes, and a replica whose price
-- book is older reloads it before deciding: no replica ever prices with a
-- book that misses a committed price.
CREATE TABLE price_book_version (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    v   bigint  NOT NULL
);
INSERT INTO price_book_version VALUES (true, 0);
-- +goose StatementBegin
CREATE FUNCTION model_prices_bump_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE price_book_version SET v = v + 1;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER model_prices_version AFTER INSERT ON model_prices
    FOR EACH STATEMENT EXECUTE FUNCTION model_prices_bump_version();

-- +goose Down
DROP TRIGGER model_prices_version ON model_prices;
DROP FUNCTION model_prices_bump_version();
DROP TABLE price_book_version;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ledger_canonical(e ledger_entries) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ledger_field('tokengate-ledger-v1')
    || ledger_field(e.tenant_id)
    || ledger_field(e.seq::text)
    || ledger_field(e.kind)
    || ledger_field(ledger_micros(e.created_at))
    || ledger_field(coalesce(e.admission_id, ''))
    || ledger_field(coalesce(e.model, ''))
    || coalesce(ledger_field(e.estimate::text), '\x7e'::bytea)
    || coalesce(ledger_field(e.actual::text), '\x7e'::bytea)
    || ledger_field(e.refill_micro::text)
    || ledger_field(e.delta_micro::text)
    || ledger_field(e.balance_micro::text)
    || coalesce(ledger_field(ledger_micros(e.period_start)), '\x7e'::bytea)
    || ledger_field(e.period_used::text)
    || ledger_field(CASE WHEN e.late THEN '1' ELSE '0' END)
    || ledger_field(e.actor)
    || ledger_field(coalesce(e.reason, ''))
    || ledger_field(coalesce(e.detail, '')) $$;
-- +goose StatementEnd
ALTER TABLE ledger_entries DROP COLUMN windows, DROP COLUMN money_micro;
ALTER TABLE deferred_settles DROP COLUMN reasoning_tokens;
ALTER TABLE admissions DROP COLUMN money_actual, DROP COLUMN money_estimate,
    DROP COLUMN price_from, DROP COLUMN price_model;
ALTER TABLE tenants
    ADD COLUMN period_budget bigint CHECK (period_budget > 0),
    ADD COLUMN period text CHECK (period IN ('day', 'month')),
    ADD COLUMN period_start timestamptz,
    ADD COLUMN period_used bigint NOT NULL DEFAULT 0;
UPDATE tenants t
SET period_budget = (w->>'tokens')::bigint, period = w->>'unit',
    period_start = (SELECT (u->>'start')::timestamptz FROM jsonb_array_elements(t.window_usage) u WHERE u->>'name' = 'period'),
    period_used = coalesce((SELECT (u->>'used')::bigint FROM jsonb_array_elements(t.window_usage) u WHERE u->>'name' = 'period'), 0)
FROM jsonb_array_elements(t.windows) w
WHERE w->>'name' = 'period' AND w->>'unit' IN ('day', 'month') AND w ? 'tokens';
ALTER TABLE tenants DROP COLUMN window_usage, DROP COLUMN windows;
