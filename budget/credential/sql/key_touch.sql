UPDATE api_keys SET last_used_at = clock_timestamp()
WHERE id = $1
