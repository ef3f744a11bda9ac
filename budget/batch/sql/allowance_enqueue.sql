-- Adds $2 (negative: gives back) to what a tenant has enqueued.
UPDATE batch_allowances SET enqueued_micro = enqueued_micro + $2 WHERE tenant_id = $1
