-- A batch under its tenant's row lock (taken first).
SELECT state, provider, coalesce(upstream_id, ''), lines, reserved_micro, created_at, expires_at, coalesce(outcome, '')
FROM batches WHERE id = $1 AND tenant_id = $2 FOR UPDATE
