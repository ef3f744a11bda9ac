SELECT tenant_id, minute, limit_name, shadow, window_name, count
FROM rejection_counts
WHERE minute >= (SELECT date_trunc('minute', clock_timestamp() - make_interval(secs => $1)))
ORDER BY tenant_id, minute, limit_name, shadow, window_name
