-- The live leases taken at a level of a tree (the tenant's own, and its
-- descendants'): the budget that level holds outside its balance.
SELECT id, slice_micro, used_micro FROM leases WHERE state = 'live' AND $1 = ANY (levels) ORDER BY id
