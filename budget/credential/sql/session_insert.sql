INSERT INTO admin_sessions (id_hash, token_id, csrf, expires_at)
VALUES ($1, $2, $3, clock_timestamp() + make_interval(secs => $4))
RETURNING expires_at
