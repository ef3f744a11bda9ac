-- A tenant's batch allowance, under its tenant's row lock (taken first).
SELECT capacity_micro, enqueued_micro FROM batch_allowances WHERE tenant_id = $1 FOR UPDATE
