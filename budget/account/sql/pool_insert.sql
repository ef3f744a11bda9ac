-- A new pool starts full. The capacity is validated (at most 1e12 tokens),
-- and bigint arithmetic never wraps: past int64 it fails with SQLSTATE
-- 22003, which the store reports as ErrOverflow.
INSERT INTO pools (id, tokens_capacity, tokens_rate_micro, tokens_micro, tokens_at)
VALUES ($1, $2::bigint, $3, $2::bigint * 1000000, coalesce($4::timestamptz, clock_timestamp()))
ON CONFLICT (id) DO NOTHING
