DELETE FROM pool_models WHERE model = $1
