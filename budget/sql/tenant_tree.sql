-- The budget tree that holds a tenant: its root and every tenant whose
-- path starts at that root, in id order (tenants_root_idx).
WITH root AS (SELECT coalesce(path[1], id) AS id FROM tenants WHERE id = $1)
SELECT * FROM tenants
WHERE id = (SELECT id FROM root) OR path[1] = (SELECT id FROM root)
ORDER BY id
