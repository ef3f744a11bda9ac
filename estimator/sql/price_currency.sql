SELECT currency FROM model_prices LIMIT 1
