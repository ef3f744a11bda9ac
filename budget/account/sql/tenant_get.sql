SELECT * FROM tenants WHERE id = $1
