-- A lease's use in a group cut back by the admissions its keys refused
-- (revoked, or the model out of the key's scope): used_micro is what its
-- journal holds.
UPDATE leases SET used_micro = used_micro - $2 WHERE id = $1
