SELECT * FROM gateway_credentials ORDER BY created_at, id
