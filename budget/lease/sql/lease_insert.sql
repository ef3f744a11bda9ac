-- A lease taken: its slice was debited at every level in this transaction.
INSERT INTO leases (id, tenant_id, holder, state, levels, slice_micro, taken_at, renewed_at, expires_at)
VALUES ($1, $2, $3, 'live', $4, $5, $6, $6, $7)
