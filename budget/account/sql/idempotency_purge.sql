DELETE FROM idempotency_keys
WHERE ctid IN (
    SELECT ctid FROM idempotency_keys
    WHERE created_at < (SELECT clock_timestamp() - interval '24 hours')
    LIMIT $1
)
