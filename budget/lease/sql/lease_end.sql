-- A lease ended ($2 returned or expired), its journal booked to the last
-- row under the lease row's lock: booked_micro = used_micro from here on.
UPDATE leases
SET state = $2, booked_micro = used_micro, ended_at = $3
WHERE id = $1
