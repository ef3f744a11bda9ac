SELECT * FROM tenants ORDER BY id
