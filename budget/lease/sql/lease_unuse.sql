-- A group's use of its leases ($1 ids) cut back ($2 each) by the
-- admissions it did not journal (a replay, a credential's refusal): the
-- leases' used_micro is what their journal holds. The rows are locked by
-- the group already.
UPDATE leases l SET used_micro = l.used_micro - u.cut
FROM unnest($1::text[], $2::bigint[]) AS u (id, cut)
WHERE l.id = u.id
