INSERT INTO pools (id, tokens_capacity, tokens_rate_micro, tokens_micro, tokens_at)
VALUES ($1, $2::bigint, $3, $2::bigint * 1000000, coalesce($4::timestamptz, clock_timestamp()))
ON CONFLICT (id) DO NOTHING
