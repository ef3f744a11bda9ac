UPDATE alert_events SET state = 'pending', next_attempt_at = clock_timestamp()
WHERE id = $1 AND state = 'failed'
  AND EXISTS (SELECT 1 FROM alert_endpoints e WHERE e.id = endpoint_id AND e.disabled_at IS NULL)
