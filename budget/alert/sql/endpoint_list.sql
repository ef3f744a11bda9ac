SELECT e.id, e.url, e.description, e.created_at, e.disabled_at,
       (SELECT count(*) FROM alert_events v WHERE v.endpoint_id = e.id AND v.state = 'pending') AS pending,
       (SELECT count(*) FROM alert_events v WHERE v.endpoint_id = e.id AND v.state = 'failed') AS failed
FROM alert_endpoints e
ORDER BY e.created_at, e.id
