-- A tenant's batch allowance, read without a lock (what an upload checks
-- its lines' models against; the reserve checks the amounts again locked).
SELECT capacity_micro, enqueued_micro, models FROM batch_allowances WHERE tenant_id = $1
