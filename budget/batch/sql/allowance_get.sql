-- A tenant's batch allowance, read without a lock (an upload checks it is
-- there; the reserve checks the amounts again locked).
SELECT capacity_micro, enqueued_micro FROM batch_allowances WHERE tenant_id = $1
