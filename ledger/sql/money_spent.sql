-- The money each (tenant, since) pair's entries moved from since on: one
-- sum per pair, in the order given. Each sum is a range scan of
-- ledger_entries_tenant_created_idx (tenant_id, created_at, seq) from
-- since: a window's span costs the tenant's entries in it, neither its
-- whole chain nor other tenants' entries of the span.
SELECT (
    SELECT coalesce(sum(e.money_micro), 0)::bigint
    FROM ledger_entries e
    WHERE e.created_at >= s.since AND e.tenant_id = s.tenant_id
) AS spent
FROM unnest($1::text[], $2::timestamptz[]) WITH ORDINALITY AS s (tenant_id, since, i)
ORDER BY s.i
