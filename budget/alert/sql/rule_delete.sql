UPDATE alert_rules SET deleted_at = clock_timestamp() WHERE id = $1 AND deleted_at IS NULL
