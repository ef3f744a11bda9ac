-- A lease booked by a decision that ends one of its admissions: its
-- journal is in the ledger (booked = used); its state and expiry stay.
UPDATE leases SET booked_micro = used_micro WHERE id = $1
