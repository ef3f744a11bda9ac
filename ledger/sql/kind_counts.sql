SELECT tenant_id, date_trunc('minute', created_at) AS minute, count(*)
FROM ledger_entries
WHERE kind = $1 AND created_at >= (SELECT date_trunc('minute', clock_timestamp() - make_interval(secs => $2)))
GROUP BY tenant_id, minute
ORDER BY tenant_id, minute
