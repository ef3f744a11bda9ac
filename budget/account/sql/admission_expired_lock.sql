-- Up to $2 overdue reservations of each of a batch's tenants (the time
-- computed once, see admission_expired_tenants.sql), locked after the
-- tenants, tenant by tenant in id order; those another replica's sweep
-- holds are skipped, and so are leased admissions whose ledger entries are
-- still to write: their lease's booking (within a lease TTL) comes first,
-- so that the expire entry follows the reserve entry.
SELECT a.id, a.tenant_id, a.state, a.model, a.input_tokens, a.output_tokens, a.cost, a.approximate,
       a.input_weight_micro, a.output_weight_micro, a.created_at, a.expires_at, a.ended_at, a.late,
       a.actual_input, a.actual_output, a.actual_cost, a.end_delta_micro, a.end_balance_micro, a.shadowed,
       a.family, a.model_levels, a.pool_id, a.price_model, a.price_from, a.price_tier, a.money_estimate,
       a.money_actual, a.face, a.debited_micro
FROM unnest($1::text[]) AS t (id)
CROSS JOIN LATERAL (
    SELECT * FROM admissions
    WHERE tenant_id = t.id AND state = 'reserved'
      AND expires_at <= (SELECT coalesce($3::timestamptz, clock_timestamp()))
      AND (lease_id IS NULL
           OR lease_seq <= coalesce((SELECT b.booked_seq FROM admission_lease_books b WHERE b.lease_id = admissions.lease_id), 0))
    ORDER BY expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
) AS a
