SELECT * FROM gateway_credentials WHERE id = $1
