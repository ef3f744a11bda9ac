-- A live lease of a tenant below the one an admin change locked, made past
-- its expiry at once ($2, the change's time): the journal refuses it from
-- the change's commit, and a sweeper or the change's caller ends it (books
-- its journal, refunds the rest) under its own tree's locks.
UPDATE leases SET expires_at = least(expires_at, $2) WHERE id = $1
