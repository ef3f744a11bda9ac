UPDATE admin_tokens SET last_used_at = clock_timestamp() WHERE id = $1
