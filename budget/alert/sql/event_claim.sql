-- Lease up to $2 due events to replica $1 for $3 ms: take them FOR UPDATE
-- SKIP LOCKED (replicas never wait for each other), count the attempt,
-- mark the attempts of replicas whose lease ran out as abandoned, and open
-- this attempt as in_flight, all in one statement.
WITH due AS (
    SELECT id FROM alert_events
    WHERE state = 'pending' AND next_attempt_at <= clock_timestamp()
      AND (lease_until IS NULL OR lease_until < clock_timestamp())
    ORDER BY next_attempt_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE alert_events v
    SET attempts = v.attempts + 1, leased_by = $1, lease_until = clock_timestamp() + $3 * interval '1 millisecond'
    FROM due WHERE v.id = due.id
    RETURNING v.id, v.endpoint_id, v.type, v.payload, v.attempts, v.created_at
), abandoned AS (
    UPDATE alert_attempts a
    SET outcome = 'abandoned', finished_at = clock_timestamp(),
        error = 'no outcome recorded before the lease ran out (the replica stopped or stalled)'
    FROM claimed c WHERE a.event_id = c.id AND a.outcome = 'in_flight'
), started AS (
    INSERT INTO alert_attempts (event_id, attempt, replica, started_at, outcome)
    SELECT id, attempts, $1, clock_timestamp(), 'in_flight' FROM claimed
)
SELECT c.id, c.type, c.payload, c.attempts, c.created_at, e.id, e.url, e.secret_salt, e.disabled_at IS NOT NULL
FROM claimed c JOIN alert_endpoints e ON e.id = c.endpoint_id
