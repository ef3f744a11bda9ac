DELETE FROM admin_sessions WHERE id_hash = $1 OR expires_at < clock_timestamp()
