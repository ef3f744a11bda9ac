-- A kept settle or release, applied to its replayed admission.
DELETE FROM deferred_settles WHERE tenant_id = $1 AND key = $2
