SELECT * FROM model_prices WHERE model = $1 AND effective_from <= $2 ORDER BY effective_from DESC LIMIT 1
