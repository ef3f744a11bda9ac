SELECT DISTINCT ON (model) * FROM model_prices
WHERE effective_from <= $1 AND ($2 = '' OR model = $2)
ORDER BY model, effective_from DESC
