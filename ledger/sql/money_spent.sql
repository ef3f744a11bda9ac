-- The money each (tenant, since) pair's entries moved from since on, as a
-- window counts it (budget.TenantState.EndExcept): every entry of an
-- admission reserved in the span, and only the extra charges (positive
-- money) of one reserved before it, whose refunds went back to the span
-- that bore its estimate. One sum per pair, in the order given.
--
-- Each sum is a range scan of ledger_entries_tenant_created_idx
-- (tenant_id, created_at, seq) from since: a window's span costs the
-- tenant's entries in it, neither its whole chain nor other tenants'.
SELECT (
    SELECT coalesce(sum(x.money_micro), 0)::bigint
    FROM (
        SELECT e.money_micro,
               bool_or(e.kind = 'reserve') OVER (PARTITION BY e.admission_id) AS reserved_in_span
        FROM ledger_entries e
        WHERE e.tenant_id = s.tenant_id AND e.created_at >= s.since AND e.money_micro IS NOT NULL
    ) x
    WHERE x.money_micro > 0 OR x.reserved_in_span
) AS spent
FROM unnest($1::text[], $2::timestamptz[]) WITH ORDINALITY AS s (tenant_id, since, i)
ORDER BY s.i
