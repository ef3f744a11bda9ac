UPDATE tenants SET allowed_models = $2 WHERE id = $1
