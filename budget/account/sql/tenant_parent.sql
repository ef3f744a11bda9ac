-- A new tenant's parent: its path, which the child extends, and whether it
-- is an end user (a leaf, which cannot be a parent).
SELECT path, end_user_of IS NOT NULL FROM tenants WHERE id = $1
