-- A new tenant's parent: its path, which the child extends.
SELECT path FROM tenants WHERE id = $1
