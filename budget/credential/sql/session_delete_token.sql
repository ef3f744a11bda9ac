DELETE FROM admin_sessions WHERE token_id = $1
