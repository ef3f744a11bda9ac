-- The money each (tenant, since) pair's entries moved from since on: one
-- sum per pair, in the order given. Each sum reads the tenant's entries by
-- created_at through ledger_entries_created_idx (created_at, tenant_id,
-- seq), so a window's span costs the entries in it, not the whole chain.
SELECT (
    SELECT coalesce(sum(e.money_micro), 0)::bigint
    FROM ledger_entries e
    WHERE e.created_at >= s.since AND e.tenant_id = s.tenant_id
) AS spent
FROM unnest($1::text[], $2::timestamptz[]) WITH ORDINALITY AS s (tenant_id, since, i)
ORDER BY s.i
