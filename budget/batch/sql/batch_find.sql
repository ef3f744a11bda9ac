-- A batch by the upstream's id, or by tokengate's (either matches $2).
SELECT id, tenant_id FROM batches WHERE provider = $1 AND (upstream_id = $2 OR id = $2) AND tenant_id = $3
