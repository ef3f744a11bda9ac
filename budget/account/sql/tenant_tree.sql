-- The budget tree that holds a tenant: its root and every tenant whose
-- path starts at that root, in id order (tenants_root_idx). End users are
-- left out (they may be thousands; EndUserList pages through them), but
-- for the tenant asked for, when it is one.
WITH root AS (SELECT coalesce(path[1], id) AS id FROM tenants WHERE id = $1)
SELECT * FROM tenants
WHERE (id = (SELECT id FROM root) OR path[1] = (SELECT id FROM root))
  AND (end_user_of IS NULL OR id = $1)
ORDER BY id
