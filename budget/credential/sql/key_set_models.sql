-- A key's model scope, returned as it was before, under its tenant's lock
-- (account.Store.RecordKeyEvent), which every decision on the key takes.
UPDATE api_keys k SET allowed_models = $3
FROM (SELECT allowed_models FROM api_keys WHERE id = $1 AND tenant_id = $2 AND revoked_at IS NULL FOR UPDATE) old
WHERE k.id = $1
RETURNING old.allowed_models
