-- One transaction-scoped advisory lock per (tenant, Idempotency-Key), taken
-- in the order of their hashes (the aggregate reads the sorted rows in
-- order), so that two takers never wait on each other in a cycle. A
-- decision takes them after its tenant rows, before it reads the keys; a
-- lease journal group (budget/lease) before it reads and journals them:
-- a key is unique per tenant across idempotency_keys and the journal.
SELECT count(pg_advisory_xact_lock(s.h))
FROM (SELECT DISTINCT hashtextextended(u.tenant_id || ' ' || u.key, 0) AS h
      FROM unnest($1::text[], $2::text[]) AS u (tenant_id, key)
      ORDER BY h) AS s
