UPDATE alert_endpoints SET secret_salt = $2 WHERE id = $1 AND disabled_at IS NULL
