-- A tenant's live end users, locked in id order after the tenant (one
-- depth below it): the global lock order, by depth then id.
SELECT * FROM tenants WHERE end_user_of = $1 AND end_user_expired_at IS NULL ORDER BY id FOR UPDATE
