INSERT INTO alert_endpoints (id, url, description, secret_salt)
VALUES ($1, $2, $3, $4)
RETURNING id, url, description, created_at, disabled_at
