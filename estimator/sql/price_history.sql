SELECT * FROM model_prices WHERE model = $1 ORDER BY effective_from, service_tier
