-- An uploaded input file, as estimated before it was forwarded.
INSERT INTO batch_files (provider, id, tenant_id, endpoint, lines, created_at)
VALUES ($1, $2, $3, $4, $5, coalesce($6::timestamptz, clock_timestamp()))
