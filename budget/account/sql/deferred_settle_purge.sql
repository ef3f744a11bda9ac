-- Kept settles and releases whose admission never arrived within the
-- idempotency window (24 h): none can arrive any more.
DELETE FROM deferred_settles
WHERE ctid IN (
    SELECT ctid FROM deferred_settles
    WHERE created_at < (SELECT clock_timestamp() - interval '24 hours')
    LIMIT $1
)
