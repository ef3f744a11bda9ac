-- The model scopes on a request's way, without locks (a batch file's plan;
-- a decision reads them under its tenant locks): its tenant's and each
-- ancestor's, root first, then its key's ($2, '' for none: no row). The
-- key table is credential's; this only reads it, as key_live.sql does.
SELECT t.id, t.allowed_models, t.depth AS level
FROM tenants t, (SELECT id, path FROM tenants WHERE id = $1) me
WHERE t.id = ANY (me.path || me.id)
UNION ALL
SELECT k.id, k.allowed_models, -1
FROM api_keys k
WHERE k.id = $2 AND k.tenant_id = $1
ORDER BY level
