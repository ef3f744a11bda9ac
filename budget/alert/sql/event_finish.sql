-- Record attempt $3 of event $1 by replica $2. The event changes only while
-- this attempt still holds its lease: delivered ($4), or back to pending
-- at $6 ms from now, or failed for good when $7 (given up) is true. An
-- attempt that lost its lease is recorded superseded, so an event is
-- recorded delivered exactly once.
WITH ev AS (
    UPDATE alert_events
    SET state = CASE WHEN $4 THEN 'delivered' WHEN $7 THEN 'failed' ELSE 'pending' END,
        delivered_at = CASE WHEN $4 THEN clock_timestamp() END,
        next_attempt_at = CASE WHEN $4 OR $7 THEN next_attempt_at ELSE clock_timestamp() + $6 * interval '1 millisecond' END,
        leased_by = NULL, lease_until = NULL
    WHERE id = $1 AND leased_by = $2 AND attempts = $3 AND state = 'pending'
    RETURNING id
)
UPDATE alert_attempts
SET outcome = CASE WHEN NOT EXISTS (SELECT 1 FROM ev) THEN 'superseded' WHEN $4 THEN 'delivered' ELSE 'failed' END,
    finished_at = clock_timestamp(), status_code = $5, error = $8, duration_ms = $9
WHERE event_id = $1 AND attempt = $3
RETURNING outcome
