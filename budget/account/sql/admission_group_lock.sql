-- The state rows of the groups that hold admissions a batch names (by id,
-- $1, or by a tenant's live Idempotency-Key, $2 and $3) and found no
-- admissions row for (admission_lock.sql): a groups-shape journal's
-- (00039), whose ids name their group (admission_group). Locked in seq
-- order before admission_materialize.sql copies them, in a statement of
-- its own so that the copy's snapshot sees every end a journal group
-- made before the lock was granted.
WITH c AS (
    SELECT id FROM unnest($1::text[]) AS id
    UNION
    SELECT k.admission_id
    FROM unnest($2::text[], $3::text[]) AS q (tenant_id, key)
    CROSS JOIN LATERAL (
        SELECT k.admission_id FROM idempotency_keys k
        WHERE k.tenant_id = q.tenant_id AND k.key = q.key
          AND k.created_at > coalesce($4::timestamptz, clock_timestamp()) - interval '24 hours'
        LIMIT 1
    ) k
)
SELECT s.seq
FROM lease_group_states s
WHERE s.seq = ANY (ARRAY(
    SELECT g.seq
    FROM c
    CROSS JOIN LATERAL admission_group(c.id) AS ag
    CROSS JOIN LATERAL (SELECT g.seq FROM lease_groups g WHERE g.holder = ag.holder AND g.count = ag.count AND c.id = ANY (g.ids) LIMIT 1) g))
ORDER BY s.seq
FOR UPDATE
