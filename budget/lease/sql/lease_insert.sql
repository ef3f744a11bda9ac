-- A lease taken: its slice was debited at every level in this transaction.
-- group_from is the last seq a journal group drew (00039): every group
-- that uses the lease locks its row first, so draws a later one, and its
-- booking reads its holder's groups from there. (A sequence never drawn
-- from holds the value its first nextval returns.)
INSERT INTO leases (id, tenant_id, holder, state, levels, slice_micro, taken_at, renewed_at, expires_at, group_from)
VALUES ($1, $2, $3, 'live', $4, $5, $6, $6, $7, (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM admissions_lease_seq))
