SELECT * FROM model_prices ORDER BY model, effective_from
