UPDATE tenants SET disabled_at = $2 WHERE id = $1
