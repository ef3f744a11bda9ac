SELECT v.id, v.rule_id, v.endpoint_id, v.tenant_id, v.type, v.payload, v.created_at, v.state, v.attempts,
       v.next_attempt_at, v.delivered_at,
       coalesce((SELECT jsonb_agg(jsonb_build_object('attempt', a.attempt, 'replica', a.replica, 'started_at', a.started_at,
                     'finished_at', a.finished_at, 'outcome', a.outcome, 'status_code', a.status_code, 'error', a.error,
                     'duration_ms', a.duration_ms) ORDER BY a.attempt)
                 FROM alert_attempts a WHERE a.event_id = v.id), '[]')
FROM alert_events v
WHERE ($1::text IS NULL OR v.tenant_id = $1)
  AND ($2::text IS NULL OR v.state = $2)
  AND ($3::text IS NULL OR v.endpoint_id = $3)
ORDER BY v.created_at DESC, v.id
LIMIT $4
