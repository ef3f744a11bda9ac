-- A batch, reserved.
INSERT INTO batches (id, provider, tenant_id, key_id, file_id, state, lines, reserved_micro, created_at, expires_at,
                     money_micro)
VALUES ($1, $2, $3, $4, $5, 'open', $6, $7, $8, $9, $10)
