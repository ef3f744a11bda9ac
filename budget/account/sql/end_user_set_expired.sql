-- Marks an end user expired ($2 the time) or live again ($2 NULL), under
-- its row lock.
UPDATE tenants SET end_user_expired_at = $2 WHERE id = $1 AND end_user_of IS NOT NULL
