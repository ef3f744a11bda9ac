-- A key written by the replay of a local admission. If the key already
-- names a live admission (the store admitted the same request before the
-- outage began), that first decision stands; an expired key is replaced.
INSERT INTO idempotency_keys (tenant_id, key, admission_id, request_hash, response, created_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (tenant_id, key) DO UPDATE
SET admission_id = excluded.admission_id, request_hash = excluded.request_hash,
    response = excluded.response, created_at = excluded.created_at
WHERE idempotency_keys.created_at <= excluded.created_at - interval '24 hours'
