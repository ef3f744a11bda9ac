-- How many live (not expired) end users a tenant has: read under the
-- tenant's row lock, which every creation and revival holds, so the count
-- cannot change before the transaction ends but by expiry (which lowers it).
SELECT count(*)::int FROM tenants WHERE end_user_of = $1 AND end_user_expired_at IS NULL
