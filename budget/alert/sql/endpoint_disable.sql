UPDATE alert_endpoints SET disabled_at = clock_timestamp() WHERE id = $1 AND disabled_at IS NULL
