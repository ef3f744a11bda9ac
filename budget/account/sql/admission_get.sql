-- One of a tenant's admissions: its admissions row, or, for an admission
-- of a groups-shape journal (00039) never copied into admissions
-- (admission_materialize.sql), its group row, read through the group its
-- id names: reserved while open, settled as the journal's ending group
-- row records it once the journal ended it (an admission the exact path
-- or the sweeper ended has its row).
SELECT id, tenant_id, state, model, input_tokens, output_tokens, cost, approximate, input_weight_micro,
       output_weight_micro, created_at, expires_at, ended_at, late, actual_input, actual_output,
       actual_cost, end_delta_micro, end_balance_micro, shadowed, family, model_levels, pool_id,
       price_model, price_from, price_tier, money_estimate, money_actual, face, debited_micro
FROM admissions WHERE id = $1 AND tenant_id = $2
UNION ALL
SELECT $1, g.tenant_ids[p.pos], CASE WHEN eg.seq IS NULL THEN 'reserved' ELSE 'settled' END, g.models[p.pos],
       g.input[p.pos], g.output[p.pos], g.cost[p.pos], g.approximate[p.pos], g.input_weight[p.pos],
       g.output_weight[p.pos], g.created_at, g.expires_at[p.pos], eg.created_at, false, eg.end_input[j.j],
       eg.end_output[j.j], eg.end_cost[j.j], eg.end_refund[j.j], NULL::bigint, '{}'::text[], nullif(g.families[p.pos], ''),
       '{}'::text[], NULL::text, nullif(g.price_models[p.pos], ''), g.price_from[p.pos], nullif(g.price_tiers[p.pos], ''),
       g.money_estimate[p.pos], eg.end_money[j.j], g.faces[p.pos], NULL::bigint
FROM admission_group($1) AS ag
CROSS JOIN LATERAL (SELECT * FROM lease_groups g WHERE g.holder = ag.holder AND g.count = ag.count AND $1 = ANY (g.ids) LIMIT 1) g
CROSS JOIN LATERAL (SELECT array_position(g.ids, $1) AS pos) p
CROSS JOIN LATERAL (SELECT * FROM lease_group_states s WHERE s.seq = g.seq OFFSET 0) s
LEFT JOIN LATERAL (SELECT * FROM lease_groups eg WHERE eg.seq = s.ended_by[array_position(s.ended, p.pos)] AND eg.seq > 0 OFFSET 0) eg ON true
CROSS JOIN LATERAL (SELECT array_position(eg.end_ids, $1) AS j) j
WHERE g.tenant_ids[p.pos] = $2 AND NOT EXISTS (SELECT 1 FROM admissions a WHERE a.id = $1)
