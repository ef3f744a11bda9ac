-- The admissions a batch makes, one array element per admission. shadowed
-- and model_levels come as one comma-separated text per admission (unnest flattens arrays
-- of arrays); tenant ids and limit names never hold a comma. face is the
-- face that made it (budget.Face); debited_micro what its reserve took from
-- the token balance when less than its estimate (a replay at the debt
-- floor), else NULL. price_tier is the service tier of its price row
-- (NULL: none, or the default tier).
INSERT INTO admissions (
    id, tenant_id, state, model, input_tokens, output_tokens, cost, approximate,
    input_weight_micro, output_weight_micro, created_at, expires_at, shadowed, family, model_levels, pool_id,
    price_model, price_from, money_estimate, face, debited_micro, price_tier
)
SELECT u.id, u.tenant_id, 'reserved', u.model, u.input_tokens, u.output_tokens, u.cost, u.approximate,
       u.input_weight_micro, u.output_weight_micro, u.created_at, u.expires_at,
       coalesce(string_to_array(nullif(u.shadowed, ''), ','), '{}'), nullif(u.family, ''),
       coalesce(string_to_array(nullif(u.model_levels, ''), ','), '{}'), nullif(u.pool_id, ''),
       nullif(u.price_model, ''), u.price_from, u.money_estimate, u.face, u.debited_micro, nullif(u.price_tier, '')
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::boolean[],
            $8::bigint[], $9::bigint[], $10::timestamptz[], $11::timestamptz[], $12::text[],
            $13::text[], $14::text[], $15::text[], $16::text[], $17::timestamptz[], $18::bigint[],
            $19::text[], $20::bigint[], $21::text[])
     AS u (id, tenant_id, model, input_tokens, output_tokens, cost, approximate,
           input_weight_micro, output_weight_micro, created_at, expires_at, shadowed, family, model_levels, pool_id,
           price_model, price_from, money_estimate, face, debited_micro, price_tier)
