SELECT * FROM model_prices WHERE model = $1 AND effective_from <= $2 AND service_tier = $3 ORDER BY effective_from DESC LIMIT 1
