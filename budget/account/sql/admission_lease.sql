-- The lease an admission was made from: its admissions row's, or, for an
-- admission of a groups-shape journal (00039), its group row's, found
-- through the group its id names.
SELECT coalesce((SELECT lease_id FROM admissions WHERE id = $1),
                (SELECT g.lease_ids[array_position(g.ids, $1)]
                 FROM admission_group($1) AS ag
                 CROSS JOIN LATERAL (SELECT g.ids, g.lease_ids FROM lease_groups g
                                     WHERE g.holder = ag.holder AND g.count = ag.count AND $1 = ANY (g.ids) LIMIT 1) g),
                '')
