-- The journal rows just appended to the ledger.
UPDATE lease_admissions SET booked = true WHERE lease_id = $1 AND NOT booked
