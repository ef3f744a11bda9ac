-- +goose Up
-- The face that made each admission (budget.Face: 'api', 'proxy', 'rls'):
-- only it may settle or release the admission. Without it a tenant ended
-- its own proxy stream mid-way, by the id the proxy sends it, and the call
-- cost nothing (issue 36, P1). A new row always names its face; 'api' is
-- what every admission was before faces were told apart.
ALTER TABLE admissions ADD COLUMN face text NOT NULL DEFAULT 'api' CHECK (face IN ('api', 'proxy', 'rls'));

-- The admissions made before that can still be ended (open ones; expired
-- ones, which a late settle still reconciles) or named by a live
-- Idempotency-Key get their face from the actor of their reserve entry, as
-- each face wrote it ('proxy:key:<id>', 'gateway:<name>'; the API's is
-- 'key:<id>', which stays 'api').
UPDATE admissions a
SET face = CASE WHEN e.actor LIKE 'proxy:%' THEN 'proxy' ELSE 'rls' END
FROM ledger_entries e
WHERE (a.state IN ('reserved', 'expired') OR a.id IN (SELECT admission_id FROM idempotency_keys))
  AND e.admission_id = a.id AND e.tenant_id = a.tenant_id AND e.kind = 'reserve'
  AND (e.actor LIKE 'proxy:%' OR e.actor LIKE 'gateway:%');
-- A gateway's request admitted by a replica on its own during an outage
-- was replayed under the replica's actor; its key is the gateway's
-- ('rls:<request id>').
UPDATE admissions a
SET face = 'rls'
FROM idempotency_keys k, ledger_entries e
WHERE k.admission_id = a.id AND k.key LIKE 'rls:%' AND a.face = 'api'
  AND e.admission_id = a.id AND e.tenant_id = a.tenant_id AND e.kind = 'reserve' AND e.actor LIKE 'replica:%';

-- Idempotency-Keys live in their face's namespace (budget.Face.StoredKey:
-- the API's as they are, another face's prefixed '<face> ', a space no key
-- holds), so that the same key sent through two faces never meets: the
-- live keys of the proxy's and the gateway's admissions move into theirs,
-- and the settles a gateway's stream end kept by key (deferred_settles;
-- only the gateway settles by key) with them.
UPDATE idempotency_keys k
SET key = a.face || ' ' || k.key
FROM admissions a
WHERE a.id = k.admission_id AND a.face <> 'api';
UPDATE deferred_settles SET key = 'rls ' || key WHERE key LIKE 'rls:%';

-- +goose Down
DELETE FROM idempotency_keys k
WHERE k.key LIKE '% %'
  AND EXISTS (SELECT 1 FROM idempotency_keys j WHERE j.tenant_id = k.tenant_id AND j.key = substr(k.key, strpos(k.key, ' ') + 1));
UPDATE idempotency_keys SET key = substr(key, strpos(key, ' ') + 1) WHERE key LIKE '% %';
UPDATE deferred_settles SET key = substr(key, strpos(key, ' ') + 1) WHERE key LIKE '% %';
ALTER TABLE admissions DROP COLUMN face;
