SELECT DISTINCT ON (model, service_tier) * FROM model_prices
WHERE effective_from <= $1 AND ($2 = '' OR model = $2) AND ($3 = '' OR service_tier = $3)
ORDER BY model, service_tier, effective_from DESC
