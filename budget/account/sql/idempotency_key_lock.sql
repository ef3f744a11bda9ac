-- One transaction-scoped advisory lock per (tenant, Idempotency-Key), taken
-- in the order of their hashes (the aggregate reads the sorted rows in
-- order), so that two takers never wait on each other in a cycle. A
-- decision takes them after its tenant rows, before it reads the keys; a
-- lease journal group (budget/lease) before it reads and journals them:
-- a key is unique per tenant across idempotency_keys and the journal.
--
-- $3 (a decision's) takes them only for the tenants with a live lease: the
-- decision holds the tenant rows (locked by the statement before this one)
-- and a lease is taken only under its tenant's row lock, so a tenant
-- without one has no journal group in flight that could journal its key
-- (a group on an ended lease is refused whole), and the tenant's row lock
-- already orders the decision with every other writer of its keys. The
-- count is the number of locks taken.
SELECT count(pg_advisory_xact_lock(s.h))
FROM (SELECT DISTINCT hashtextextended(u.tenant_id || ' ' || u.key, 0) AS h
      FROM unnest($1::text[], $2::text[]) AS u (tenant_id, key)
      WHERE NOT $3::boolean
         OR EXISTS (SELECT 1 FROM leases l WHERE l.tenant_id = u.tenant_id AND l.state = 'live')
      ORDER BY h) AS s
