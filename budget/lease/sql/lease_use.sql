-- A group commit's use of a lease: refused (no row) unless the lease is
-- live, not past its expiry by the store's clock ($3: a frozen clock, or
-- none), and keeps what it journals within its slice. It locks the lease
-- row, never the tenant's.
UPDATE leases SET used_micro = used_micro + $2
WHERE id = $1 AND state = 'live'
  AND expires_at > coalesce($3::timestamptz, clock_timestamp())
  AND used_micro + $2 <= slice_micro
RETURNING tenant_id
