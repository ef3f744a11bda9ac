SELECT s.token_id, t.name, s.csrf, s.expires_at
FROM admin_sessions s
JOIN admin_tokens t ON t.id = s.token_id
WHERE s.id_hash = $1 AND s.expires_at > clock_timestamp() AND t.revoked_at IS NULL
