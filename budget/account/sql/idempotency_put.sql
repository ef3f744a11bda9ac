-- The Idempotency-Keys of a batch's admissions. A key older than 24 h is
-- forgotten, so it is replaced.
INSERT INTO idempotency_keys (tenant_id, key, admission_id, request_hash, response, created_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::bytea[], $6::timestamptz[])
ON CONFLICT (tenant_id, key) DO UPDATE
SET admission_id = excluded.admission_id, request_hash = excluded.request_hash,
    response = excluded.response, created_at = excluded.created_at
