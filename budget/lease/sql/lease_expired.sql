-- Live leases past their expiry (the sweeper's work list), read without a
-- lock: each is rechecked under its tenant's lock.
SELECT id FROM leases
WHERE state = 'live' AND expires_at <= coalesce($1::timestamptz, clock_timestamp())
ORDER BY expires_at
LIMIT $2
